"""The what-if engine: operations in, slowdown, blame and causes out (DESIGN §5).

Pure numpy: nothing here knows about the store, the API, settings or SQLAlchemy (a test checks),
so the same engine serves `smon analyze` on a trace file and the live server on stored steps.
"""
