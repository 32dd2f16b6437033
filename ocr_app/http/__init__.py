"""The HTTP layer: the FastAPI app, its routes and dependencies, and the one mapping of errors to HTTP."""
