"""skalpel for coding agents: ``skalpel mcp``, a Model Context Protocol server over stdio (``server.py``, the
``[mcp]`` extra), whose tools run skalpel's own commands (``commands.py``)."""
