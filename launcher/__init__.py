"""The `axtrain` command line: parses, validates, resolves the mesh, writes the run directory."""
