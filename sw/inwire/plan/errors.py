"""The planner's error, below every planner module: the profiles, the cost model and the schedule file all
raise it, so none of them has to import another for it."""

from ..errors import InwireError


class ScheduleError(InwireError, ValueError):
    """A schedule file or request that cannot be used; the message names the offending entry."""
