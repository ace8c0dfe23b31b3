"""What the tests share, defined once: helpers, simulator harnesses, a real sshd, the SGLang stand-in.

Test modules, the conftest.py fixtures and bench/ import from here; nothing here is a test or a
fixture (pytest finds fixtures in conftest.py files, whose bodies call these helpers). A test module
never imports from another test module or from a conftest.
"""
