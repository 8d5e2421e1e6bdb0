"""The ``cachescale`` command line: one module per subcommand, over every layer."""
