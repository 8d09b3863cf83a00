"""Running a listener under an elector: runner, tenure, handover, standby, status, audit."""
