"""Time-of-day floors: KEDA-cron-style windows (5-field cron start/end, IANA time zone, floor replicas).

A window is active when its most recent `start` fired more recently than its most recent `end` (starts and ends
must alternate, which makes that KEDA's reading too: `Window.alternation_problem`). Local wall
times are turned into instants through zoneinfo, so DST changes move the window with the clock on the wall
(09:00 stays 09:00 local), and comparisons happen in UTC instants. Pure functions of `now`: no clock read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fleetserve.k8s.labels import dns_name

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_NAMES = {
    3: {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    4: {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())},
}
_LOOKBACK_DAYS = 400
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # 29 February fires in leap years


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message names the field."""


def _parse_field(text: str, index: int) -> frozenset[int]:
    name, lo, hi = _FIELDS[index]
    values: set[int] = set()
    for part in text.lower().split(","):
        step, stepped = 1, "/" in part
        if stepped:
            part, step_text = part.split("/", 1)
            if not step_text.isdigit() or int(step_text) == 0:
                raise ScheduleError(f"{name}: bad step {step_text!r}")
            step = int(step_text)
        if part in ("*", ""):
            start, end = lo, hi
        elif "-" in part:
            a, b = part.split("-", 1)
            start, end = _value(a, index), _value(b, index)
        else:
            start = _value(part, index)
            # `N/step` (any step, 1 too) runs to the field's end: Saturday (6) for the day of week, as robfig/cron
            # (KEDA, Karpenter) reads it; to 7 it had added a Sunday the cluster never held (`1/3`: 1, 4 and 7)
            end = (6 if index == 4 else hi) if stepped else start
            if stepped and start > end:
                raise ScheduleError(f"{name}: {part}/{step} starts past Saturday (6), where KEDA's and Karpenter's "
                                    f"cron read it; write 0/{step} for Sunday")
        if not (lo <= start <= hi and lo <= end <= hi) or start > end:
            raise ScheduleError(f"{name}: {part!r} is outside {lo}-{hi}"
                                + (" (or a range from low to high)" if "-" in part else ""))
        values.update(range(start, end + 1, step))
    if index == 4 and 7 in values:  # both 0 and 7 mean Sunday
        values.discard(7)
        values.add(0)
    return frozenset(values)


def _value(text: str, index: int) -> int:
    if text.isdigit():
        return int(text)
    try:
        return _NAMES[index][text[:3]]
    except KeyError:
        name, lo, hi = _FIELDS[index]
        names = f" or {', '.join(_NAMES[index])}" if index in _NAMES else ""
        raise ScheduleError(f"{name}: {text!r} is not a number or name; allowed: {lo}-{hi}{names}") from None


# the descriptors robfig/cron (KEDA's cron scaler) and Karpenter's budget schedules take
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
          "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


@dataclass(frozen=True)
class Cron:
    """A parsed 5-field cron expression (minute hour day-of-month month day-of-week)."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    dom_any: bool
    dow_any: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        """Five fields, or a macro of KEDA's and Karpenter's parsers (`@daily`), read as the five it stands for;
        `text` is what those parsers take: a day of the week written 7 becomes 0 (`5-7` is `0,5,6`)."""
        text = MACROS.get(text.strip().lower(), text)
        parts = text.split()
        if len(parts) != 5:
            raise ScheduleError(f"cron {text!r} needs 5 fields (minute hour day-of-month month day-of-week)")
        fields = [_parse_field(p, i) for i, p in enumerate(parts)]
        if "7" in re.findall(r"\d+", parts[4]):  # Sunday as 7: KEDA's and Karpenter's parser refuse it (0-6)
            text = " ".join(parts[:4] + [",".join(map(str, sorted(fields[4])))])
        cron = cls(text, *fields, dom_any=parts[2] == "*", dow_any=parts[4] == "*")
        if cron.dow_any and not any(d <= _MONTH_DAYS[m - 1] for m in cron.months for d in cron.days):
            # 31 February: a window that never opens (or never closes) was accepted, its floor never held
            raise ScheduleError(f"cron {text!r} never fires: day of month {','.join(map(str, sorted(cron.days)))} "
                                f"does not occur in month {','.join(map(str, sorted(cron.months)))}")
        return cron

    def shifted(self, minutes: int) -> str | None:
        """The cron text that fires `minutes` later (earlier when negative), or None where no 5-field cron can: a
        minute or hour that is not one value, or a day of the month or a month (which a move across midnight
        would carry across month ends). Weekdays move with a shift across midnight: 00:00 Monday less ten
        minutes is 23:50 Sunday (the time-of-day floors' lead on KEDA, a Karpenter budget written in UTC)."""
        if not minutes:
            return self.text
        if len(self.minutes) != 1 or len(self.hours) != 1:
            return None
        fields = self.text.split()
        total = next(iter(self.hours)) * 60 + next(iter(self.minutes)) + minutes
        days, total = divmod(total, 24 * 60)
        if days:
            if fields[2:4] != ["*", "*"]:
                return None
            if not self.dow_any:
                fields[4] = ",".join(str(d) for d in sorted((d + days) % 7 for d in self.weekdays))
        return " ".join([str(total % 60), str(total // 60)] + fields[2:])

    def _day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.dom_any or self.dow_any:  # cron: when both are restricted, either matching is enough
            return dom and dow
        return dom or dow

    def firings(self, first: date, days: int, tz: ZoneInfo):
        """Every firing instant on the `days` local days from `first`, in order."""
        for offset in range(days):
            day = first + timedelta(days=offset)
            if self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        yield datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)

    def previous(self, now: datetime, tz: ZoneInfo) -> datetime | None:
        """The latest firing instant at or before `now` (aware), or None within the look-back."""
        local = now.astimezone(tz)
        for back in range(_LOOKBACK_DAYS):
            day = local.date() - timedelta(days=back)
            if not self._day_matches(day):
                continue
            for hour in sorted(self.hours, reverse=True):
                for minute in sorted(self.minutes, reverse=True):
                    instant = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
                    # a wall time skipped by a DST jump fires at the shifted instant, like cron daemons do
                    if instant.astimezone(UTC) <= now.astimezone(UTC):
                        return instant
        return None


@dataclass(frozen=True)
class Window:
    name: str
    start: Cron
    end: Cron
    tz: ZoneInfo
    floor: int

    def intervals(self, first: date, days: int) -> list[tuple[datetime, datetime]]:
        """When the window is active, as [start, end) instants in UTC, over `days` local days from `first` (fewer
        for crons that fire many times a day: their pattern repeats daily). A start and an end at one instant
        leave it inactive, as `active` reads them."""
        per_day = max(len(c.hours) * len(c.minutes) for c in (self.start, self.end))
        days = max(2, min(days, MAX_FIRINGS // per_day))
        events = sorted([(t.astimezone(UTC), 0) for t in self.start.firings(first, days, self.tz)] +
                        [(t.astimezone(UTC), 1) for t in self.end.firings(first, days, self.tz)])
        out, since = [], None
        for t, kind in events:
            if kind == 0 and since is None:
                since = t
            elif kind == 1 and since is not None:
                if t > since:
                    out.append((since, t))
                since = None
        if since is not None:
            out.append((since, datetime.max.replace(tzinfo=UTC)))
        return out

    def alternation_problem(self, first: date, days: int) -> str | None:
        """Why the window's starts and ends do not alternate, or None. KEDA's cron scaler, which runs the window
        on Kubernetes, reads it by its *next* start and end (active while the next end comes first); `active`
        reads the *last* ones. The two agree exactly when starts and ends alternate: a start firing again before
        an end ("*/30 9-17" to "0 18") was active here all day and never in KEDA."""
        per_day = max(len(c.hours) * len(c.minutes) for c in (self.start, self.end))
        days = max(2, min(days, MAX_FIRINGS // per_day))
        events = sorted({(t.astimezone(UTC), kind) for kind, cron in ((0, self.start), (1, self.end))
                         for t in cron.firings(first, days, self.tz)})
        last: tuple[datetime, int] | None = None
        for t, kind in events:
            if last is not None and last[1] == kind and last[0] != t:
                what, other = ("start", "end") if kind == 0 else ("end", "start")
                fix = ("keep its start and end out of the hour the change to or from daylight saving time skips "
                       "or repeats" if last[0].astimezone(self.tz).utcoffset() != t.astimezone(self.tz).utcoffset()
                       else "give it one start and one end per window (e.g. start '0 9 * * 1-5', end '0 17 * * 1-5')")
                return (f"its {what} fires at {last[0].isoformat()} and again at {t.isoformat()} with no {other} "
                        "between: KEDA's cron scaler (Kubernetes) reads a window by its next start and end, and "
                        f"would keep it active at other times than fleetserve and the simulator do; {fix}")
            if last is None or last[0] != t or kind == 1:  # a start and an end at one instant: the end stands
                last = (t, kind)
        return None

    def active(self, now: datetime) -> bool:
        started = self.start.previous(now, self.tz)
        if started is None:
            return False
        ended = self.end.previous(now, self.tz)
        return ended is None or started.astimezone(UTC) > ended.astimezone(UTC)

    def active_within(self, now: datetime, lead_s: float) -> bool:
        """Active now, or opening within the next `lead_s` seconds: the floor holds from start - lead to the end,
        as the Kubernetes cron trigger's start moved earlier does. Reading only `now` and `now + lead` dropped it
        in between for a window shorter than the lead (a 2-minute window with a 5-minute lead: floor 2 at 11:55,
        0 from 11:57, 2 at 12:00, and the fleet went to zero just before its rush)."""
        if self.active(now):
            return True
        if lead_s <= 0:
            return False
        started = self.start.previous(now + timedelta(seconds=lead_s), self.tz)
        return started is not None and started.astimezone(UTC) > now.astimezone(UTC)


OVERLAP_FROM = date(2027, 6, 1)  # two years from here hold 29 February 2028
OVERLAP_DAYS = 2 * 366
MAX_FIRINGS = 20_000  # per cron and window in the overlap check
_CHECKED: dict[tuple, str | None] = {}  # overlap verdicts per set of windows


def lead_minutes(seconds: float) -> int:
    """scheduleLeadTime in whole minutes, rounded up: cron fires on minutes, so the Kubernetes trigger's start
    moves by whole minutes, and the live autoscaler and the simulator raise the floor as early (a 90 s lead had
    been 120 s on KEDA and 90 s here)."""
    return int(-(-seconds // 60))


class Schedule:
    """All floors of an endpoint; `floor(now)` is the highest active one (0 when none is active)."""

    def __init__(self, windows: list[Window]):
        self.windows = windows

    @classmethod
    def from_spec(cls, floors) -> Schedule:
        windows = []
        named: dict[str, int] = {}
        for i, f in enumerate(floors):
            where = f"spec.autoscaling.schedules[{i}]"
            # the name labels the floor's metrics and the decisions that name it, and names its KEDA cron trigger
            # as a DNS label: `Biz` and `biz`, or `biz-1` and `biz_1`, made two triggers of one name, and KEDA
            # refused the ScaledObject
            key = dns_name("floor", f.name)
            if key in named:
                j = named[key]
                same = "'s name too" if floors[j].name == f.name else \
                    f" ({floors[j].name!r}) as a Kubernetes name too ({key})"
                raise ScheduleError(f"{where}.name: {f.name!r} is schedules[{j}]{same}; give each window a name of "
                                    "its own")
            named[key] = i
            try:
                tz = ZoneInfo(f.timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ScheduleError(f"{where}.timezone: {f.timezone!r} is not an IANA time zone "
                                    "(e.g. Asia/Seoul, Europe/Berlin, UTC)") from None
            crons = []
            for field in ("start", "end"):
                try:
                    crons.append(Cron.parse(getattr(f, field)))
                except ScheduleError as exc:
                    raise ScheduleError(f"{where}.{field}: {exc}") from None
            start, end = crons
            if f.start.split() == f.end.split():
                raise ScheduleError(f"{where}: start and end must differ")
            window = Window(f.name, start, end, tz, f.min_replicas)
            key = ("alternation", f.start, f.end, f.timezone)
            if key not in _CHECKED:  # a spec is read several times (validation, the autoscaler, rendering)
                _CHECKED[key] = window.alternation_problem(OVERLAP_FROM, OVERLAP_DAYS)
            if _CHECKED[key]:
                raise ScheduleError(f"{where}: {_CHECKED[key]}")
            windows.append(window)
        schedule = cls(windows)
        schedule.check_overlaps()
        return schedule

    def floor(self, now: datetime, lead_s: float = 0.0) -> int:
        return max((w.floor for w in self.windows if w.active_within(now, lead_s)), default=0)

    def active_names(self, now: datetime, lead_s: float = 0.0) -> list[str]:
        return [w.name for w in self.windows if w.active_within(now, lead_s)]

    def check_overlaps(self, first: date = OVERLAP_FROM, days: int = OVERLAP_DAYS) -> None:
        """Reject windows that are active at the same time: each window's active intervals over `days` (two years
        from a date that puts a 29 February inside), swept in order. Steps of 5 minutes over 8 days found daily
        and weekly overlaps only (a yearly "Dec 24-26" and "Dec 25-27" passed). A spec is read several times
        (validation, the autoscaler, rendering): the verdict is kept per set of windows."""
        if len(self.windows) < 2:
            return
        key = (tuple((w.name, w.start.text, w.end.text, str(w.tz)) for w in self.windows), first, days)
        if key not in _CHECKED:
            _CHECKED[key] = self._first_overlap(first, days)
        found = _CHECKED[key]
        if found:
            raise ScheduleError(found)

    def _first_overlap(self, first: date, days: int) -> str | None:
        # by index: two windows of one name were never compared (the name is unique now, the index always was)
        spans = sorted((a, b, i) for i, w in enumerate(self.windows) for a, b in w.intervals(first, days))
        latest: tuple[datetime, int] | None = None  # the active interval that ends last so far, and its window
        for a, b, i in spans:
            if latest is not None and a < latest[0] and i != latest[1]:
                return (f"spec.autoscaling.schedules: windows {self.windows[latest[1]].name!r} and "
                        f"{self.windows[i].name!r} overlap (both active at {a.isoformat()}); give each hour one "
                        "floor")
            if latest is None or b > latest[0]:
                latest = (b, i)
        return None
