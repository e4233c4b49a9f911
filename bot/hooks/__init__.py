"""Coding assistants' permission hooks: each tool call an assistant is about to make, asked
of the operator's policy and, where it says so, of a person, before the assistant runs it.
"""
