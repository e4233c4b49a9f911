"""What may be called and who approves it: policy files, rules, tools, intake, masking."""
