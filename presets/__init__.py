"""Built-in model presets: YAML data files, one per real model (this package holds no code)."""
