"""The ``rrfp`` command line (typer). ``app.main`` is the console-script entry point."""
