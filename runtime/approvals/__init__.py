"""A request decided: one outcome on the arguments shown, in bulk, or by a standing approval."""
