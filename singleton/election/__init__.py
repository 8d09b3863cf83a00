"""Election: the state machine, its thread driver, leadership, callbacks and health."""
