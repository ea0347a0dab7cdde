"""One editor widget per knob, generated from a row of `Session.knob_table()` (never written by hand per knob).

The control follows the knob's kind: for numbers a typed entry (the value: never clamped; a value out of the knob's
range is marked by the preview) beside a slider on a stepped scale (integers: 0–8, then powers of two and 1.5× powers
of two, so 1 to 262 144 fits in 36 stops rather than 770 tokens a pixel; open-ended ranges up to a power of two well
above the current value), a checkbox for bools, toggle buttons for choices, one toggle per GPU for a GPU set, and a
text field (parsed by the knob's own parser) for names, lists and environment variables.
Each editor shows the knob's apply class (hot / restart), why it is off where it is irrelevant, and the problem
or warning a preview found for it.
"""

from __future__ import annotations

import html
import math
from typing import Any, Callable

import ipywidgets as W
import numpy as np

from workbench.knobs import KNOBS

TEXT_KINDS = ("str", "env")
SLIDER_WIDTH = "240px"
ENTRY_WIDTH = "110px"
LINEAR_UP_TO = 8  # integer stops below this are every integer


def stepped_scale(low: int, high: int, *keep: int) -> list[int]:
    """Integer stops from low to high: every integer up to LINEAR_UP_TO, then 2^k and 1.5·2^k; plus `keep` (the
    current and default values) where they lie inside."""
    stops = set(range(low, min(high, LINEAR_UP_TO) + 1))
    power = LINEAR_UP_TO
    while power <= high:
        stops.update(v for v in (power, power * 3 // 2) if low <= v <= high)
        power *= 2
    stops.update(v for v in keep if isinstance(v, int) and low <= v <= high)
    return sorted(stops)


def nearest(options: list, value: Any) -> Any:
    """The option nearest to value (the slider's place for a typed value between stops or outside the scale)."""
    return min(options, key=lambda option: abs(option - value)) if isinstance(value, (int, float)) else options[0]


def plain(value: Any) -> Any:
    """A knob-table cell as plain Python (numpy scalars and arrays from pandas become int/float/list)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def as_text(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "env":
        return "; ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _bound(value: Any) -> float | None:
    value = plain(value)
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value


class KnobEditor:
    def __init__(self, row: dict[str, Any], on_change: Callable[[str], None], gpu_count: int | None = None):
        self.name = row["name"]
        self.kind = row["kind"]
        self.apply = row["apply"]
        self.nullable = KNOBS[self.name].nullable if self.name in KNOBS else False
        self._on_change = on_change
        self._quiet = False
        self.current = plain(row["value"])
        self.control = self._make_control(row, gpu_count)
        self.label = W.HTML(
            f"<span title='{html.escape(str(row.get('help', '')))}'>{html.escape(self.name)}</span> "
            f"<span class='wb-badge wb-badge-{html.escape(self.apply)}'>{html.escape(self.apply)}</span>",
            layout=W.Layout(width="230px"),
        )
        self.message = W.HTML(_dom_classes=["wb-knob-message"])
        controls = [self.slider, self.control] if self.slider is not None else [self.control]
        self.widget = W.HBox([self.label, *controls, self.message], _dom_classes=["wb-knob", f"wb-knob-{self.name}"])
        self.widget.layout.align_items = "center"
        self.relevant = bool(row.get("relevant", True))
        self.why_irrelevant = str(row.get("why_irrelevant") or "")
        self._marks: tuple[str, str] = ("", "")
        # Off until set_enabled says whom the page serves: a viewer's page never shows an editable knob, even first.
        for control in self._controls():
            control.disabled = True
        self._render_message()

    def _controls(self) -> list[W.Widget]:
        if self.kind == "gpus":
            return list(self._gpu_buttons)
        return [self.control, self.slider] if self.slider else [self.control]

    # ----------------------------------------------------------------- building
    def _make_control(self, row: dict[str, Any], gpu_count: int | None) -> W.Widget:
        """The widget that holds the knob's value (self.control); numbers also get self.slider beside it."""
        value, default = self.current, plain(row.get("default"))
        low, high = _bound(row.get("min")), _bound(row.get("max"))
        self.slider = None
        if self.kind == "int" and not self.nullable:
            low = int(low) if low is not None else 0
            if high is None:
                top = max(abs(v) for v in (value, default, low, 4) if isinstance(v, (int, float)))
                high = 2 ** math.ceil(math.log2(16 * top))
            options = stepped_scale(low, int(high), value, default)
            self.slider = W.SelectionSlider(options=options, value=nearest(options, value), continuous_update=False,
                                            readout=False, layout=W.Layout(width=SLIDER_WIDTH))
            widget = W.IntText(value=value if value is not None else low, continuous_update=False,
                               layout=W.Layout(width=ENTRY_WIDTH))
        elif self.kind == "float" and low is not None and high is not None:
            self.slider = W.FloatSlider(value=min(max(value if value is not None else low, low), high), min=low,
                                        max=high, step=0.01, readout=False, continuous_update=False,
                                        layout=W.Layout(width=SLIDER_WIDTH))
            widget = W.FloatText(value=value if value is not None else low, continuous_update=False,
                                 layout=W.Layout(width=ENTRY_WIDTH))
        elif self.kind == "bool":
            widget = W.Checkbox(value=bool(value), indent=False, layout=W.Layout(width="auto"))
        elif self.kind == "choice":
            choices = list(plain(row.get("choices")) or [])
            widget = W.ToggleButtons(options=choices, value=value if value in choices else None,
                                     style={"button_width": "auto"})
        elif self.kind == "gpus":
            count = max([gpu_count or 0] + [i + 1 for i in (value or [])])
            self._gpu_buttons = [
                W.ToggleButton(value=i in (value or []), description=f"GPU {i}", layout=W.Layout(width="auto"))
                for i in range(count)
            ]
            for button in self._gpu_buttons:
                button.observe(self._changed, "value")
            return W.HBox(self._gpu_buttons)
        else:  # text: names, lists, environment variables, nullable numbers, unbounded floats
            placeholder = "unset (verl's default)" if self.nullable else ""
            widget = W.Text(value=as_text(self.kind, value), placeholder=placeholder, continuous_update=False,
                            layout=W.Layout(width=SLIDER_WIDTH))
        widget.observe(self._changed, "value")
        if self.slider is not None:
            self.slider.observe(self._slid, "value")
        return widget

    def _slid(self, change) -> None:
        """The slider moved: its stop is the typed entry's new value (which previews the change)."""
        if not self._quiet:
            self.control.value = change["new"]

    def _follow_entry(self) -> None:
        """Put the slider where the typed value is (the nearest stop; inside the range: a float slider clamps)."""
        if self.slider is None:
            return
        self._quiet = True
        try:
            value = self.control.value
            if isinstance(self.slider, W.SelectionSlider):
                self.slider.value = nearest(list(self.slider.options), value)
            else:
                self.slider.value = min(max(value, self.slider.min), self.slider.max)
        finally:
            self._quiet = False

    def _changed(self, _change) -> None:
        if not self._quiet:
            self._follow_entry()
            self._on_change(self.name)

    # ----------------------------------------------------------------- reading and setting
    def read(self) -> tuple[Any, str | None]:
        """(value, None), or (None, why) when the text in the control is not a value of this knob."""
        if self.kind == "gpus":
            return [i for i, b in enumerate(self._gpu_buttons) if b.value], None
        value = self.control.value
        if isinstance(self.control, W.Text):
            try:
                return KNOBS[self.name].parse(value), None
            except ValueError as error:
                return None, str(error)
        return value, None

    def is_changed(self) -> bool:
        value, error = self.read()
        return error is not None or value != self.current

    def set_current(self, row: dict[str, Any], keep_edit: bool = False) -> None:
        """The plan in force changed (or a refresh): its value and relevance; the control shows the new value, or
        keeps the user's edit (keep_edit), which is then pending against the new plan."""
        self.current = plain(row["value"])
        self.relevant = bool(row.get("relevant", True))
        self.why_irrelevant = str(row.get("why_irrelevant") or "")
        if keep_edit:
            self.mark()
        else:
            self.reset()

    def reset(self) -> None:
        self._quiet = True
        try:
            if self.kind == "gpus":
                for i, button in enumerate(self._gpu_buttons):
                    button.value = i in (self.current or [])
            elif isinstance(self.control, W.Text):
                self.control.value = as_text(self.kind, self.current)
            elif self.slider is not None:
                if isinstance(self.slider, W.SelectionSlider) and isinstance(self.current, int) \
                        and self.current not in self.slider.options:
                    options = list(self.slider.options)
                    high = max(options[-1], 2 ** math.ceil(math.log2(16 * max(self.current, 1))))
                    self.slider.options = stepped_scale(options[0], high, self.current)
                self.control.value = self.current if self.current is not None else self.control.value
            else:
                self.control.value = self.current
        finally:
            self._quiet = False
        self._follow_entry()
        self.mark()

    def set_enabled(self, operator: bool, read_only_reason: str, edit_irrelevant: bool = False) -> None:
        """Off for viewers; off where the knob changes nothing in the plan in force, unless the operator asks to
        edit such knobs too (a change that turns them on, e.g. use_dynamic_bsz with budgets, or a plan to match)."""
        enabled = operator and (self.relevant or edit_irrelevant)
        for control in self._controls():
            if control.disabled == enabled:
                control.disabled = not enabled
        self._read_only_reason = "" if operator else read_only_reason
        self._render_message()

    def mark(self, problem: str = "", warning: str = "") -> None:
        """Show a preview's verdict on this knob (empty strings clear it)."""
        self._marks = (problem, warning)
        bad = "wb-knob-bad"
        classes = tuple(c for c in self.widget._dom_classes if c != bad) + ((bad,) if problem else ())
        if classes != tuple(self.widget._dom_classes):
            self.widget._dom_classes = classes
        self._render_message()

    @property
    def problem(self) -> str:
        return self._marks[0]

    def _render_message(self) -> None:
        problem, warning = self._marks
        if problem:
            text, css = problem, "wb-problem"
        elif warning:
            text, css = warning, "wb-warning"
        elif not self.relevant:
            text, css = f"off: {self.why_irrelevant}", "wb-why"
        elif getattr(self, "_read_only_reason", ""):
            text, css = "", "wb-why"
        else:
            value, error = self.read()
            text = f"pending: {as_text(self.kind, self.current)} → {as_text(self.kind, value)}" \
                if error is None and value != self.current else ""
            css = "wb-changed"
        markup = f"<span class='{css}'>{html.escape(text)}</span>" if text else ""
        if self.message.value != markup:
            self.message.value = markup
