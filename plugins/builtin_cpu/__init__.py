"""The built-in CPU platform: the default where no accelerator is found."""
