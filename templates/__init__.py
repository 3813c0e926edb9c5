"""convgen's Jinja2 templates, shipped in the wheel as the package ``convgen.templates``.

A regular package (not a namespace one), so ``importlib.resources`` gives a real folder.
"""
