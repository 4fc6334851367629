"""The command-line interface: one small module per subcommand, errors turned into messages here."""
