"""Leader-only scheduled jobs: the scheduler, fenced fire claims, triggers, the job context."""
