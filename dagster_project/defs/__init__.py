"""The maintenance code location's definitions, one small module per kind."""
