"""The command line: the ``omni-export`` entry point (``cli``), its subcommands and the options they share."""
