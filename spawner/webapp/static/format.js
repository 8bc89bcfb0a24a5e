// What a page's script still writes itself, as the service writes it: a time in a zone
// (the rules of spawner/webapp/formatting.py's moment, spawner/quota/units.py's
// format_moment) and a name isolated in plain text: the class dashboard shows its
// schedules' times in the browser's zone (the zone its pre-warm form takes) and words what
// its actions did. Every other word of the pages is drawn by the service.
// tests/unit/test_formatting.py runs both on one table of values. Loaded before the page's
// own script, as QuotaFormat.
"use strict";

(function (root) {
  const UNKNOWN = "–";
  const isNumber = (v) => typeof v === "number" && Number.isFinite(v);
  const two = (n) => String(n).padStart(2, "0");

  // Python's format(x, "g"): what an invalid time shows of itself, as format_moment does
  function general(value) {
    if (Number.isNaN(value)) return "nan";
    if (!Number.isFinite(value)) return value < 0 ? "-inf" : "inf";
    const [mantissa, power] = value.toExponential(5).split("e");
    const exponent = Number(power); // after rounding to six digits, as Python decides
    if (exponent < -4 || exponent >= 6) {
      const digits = mantissa.replace(/\.?0+$/, "");
      return `${digits}e${exponent < 0 ? "-" : "+"}${two(Math.abs(exponent))}`;
    }
    const fixed = value.toFixed(5 - exponent);
    return fixed.includes(".") ? fixed.replace(/\.?0+$/, "") : fixed;
  }

  const clocks = new Map();
  function clock(zone) {
    // one formatter a zone; undefined: the browser's own
    if (!clocks.has(zone)) {
      clocks.set(zone, new Intl.DateTimeFormat("en-GB", {
        timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit",
        day: "2-digit", hour: "2-digit", minute: "2-digit",
      }));
    }
    return clocks.get(zone);
  }

  // a calendar date, as Python's datetime has them (years 1 to 9999); else null
  function dateOf(epoch) {
    if (!isNumber(epoch)) return null;
    const date = new Date(epoch * 1000);
    const year = date.getUTCFullYear();
    return Number.isNaN(date.getTime()) || year < 1 || year > 9999 ? null : date;
  }

  // format_moment: '2026-12-20 14:00 UTC' in ``zone`` (default: the browser's), with the
  // zone's name; a time no calendar shows (past the year 9999) as 'an invalid time (…)'
  function moment(epoch, zone) {
    if (epoch === null || epoch === undefined || epoch === "") return UNKNOWN;
    const date = dateOf(epoch);
    if (date === null) {
      const shown = typeof epoch === "number" ? general(epoch) : String(epoch).slice(0, 40);
      return `an invalid time (${shown})`;
    }
    const p = {};
    for (const part of clock(zone).formatToParts(date)) p[part.type] = part.value;
    const name = zone || clock(zone).resolvedOptions().timeZone || "local time";
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute} ${name}`;
  }

  // isolate: a name someone chose, between FIRST STRONG ISOLATE and POP DIRECTIONAL
  // ISOLATE, for plain text (an <option>, a sentence): its bidi controls stay inside it
  const isolate = (name) => `\u2068${name}\u2069`;

  root.QuotaFormat = Object.freeze({ moment, isolate });
})(globalThis);
