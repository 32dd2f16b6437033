"""The rapidocr engine (engine.py): PP-OCRv6 on the CPU; its pages turned upright (orientation.py); its
model revisions (revision.py)."""
