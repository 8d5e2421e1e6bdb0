"""Built-in scenario files (YAML), loaded by name with ``cachescale simulate --scenario``."""
