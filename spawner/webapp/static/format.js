// How the pages' scripts write sizes, durations, shares and times: the rules of
// spawner/webapp/formatting.py (spawner/quota/units.py's format_human, human_duration and
// format_moment), with the same rounding, half up, in the same float arithmetic, so a page
// drawn by the service and redrawn by its script reads alike. tests/unit/test_formatting.py
// runs both on one table of values. Loaded before the page's own script, as QuotaFormat.
"use strict";

(function (root) {
  const UNKNOWN = "–";
  const isNumber = (v) => typeof v === "number" && Number.isFinite(v);
  const halfUp = (v) => Math.floor(v + 0.5);
  const two = (n) => String(n).padStart(2, "0");

  // format_human: at most three significant digits, never an exponent
  function human(bytes) {
    if (bytes < 0) return "-" + human(-bytes);
    let value = bytes;
    let unit = "B";
    for (unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
      if (value < 1024 || unit === "TiB") break;
      value /= 1024;
    }
    const decimals = value < 10 ? 2 : value < 100 ? 1 : 0;
    const scale = 10 ** decimals;
    const scaled = Math.floor(value * scale + 0.5);
    const whole = Math.floor(scaled / scale);
    let shown = String(whole);
    if (decimals) {
      const part = String(scaled - whole * scale).padStart(decimals, "0").replace(/0+$/, "");
      if (part) shown += "." + part;
    }
    return `${shown} ${unit}`;
  }

  const size = (bytes) => (isNumber(bytes) ? human(bytes) : UNKNOWN);

  // human_duration: the two largest units
  function duration(seconds) {
    if (!isNumber(seconds)) return UNKNOWN;
    const total = Math.max(0, halfUp(seconds));
    const days = Math.floor(total / 86400);
    const hours = Math.floor((total % 86400) / 3600);
    const minutes = Math.floor((total % 3600) / 60);
    const secs = total % 60;
    if (days) return hours ? `${days}d${hours}h` : `${days}d`;
    if (hours) return minutes ? `${hours}h${two(minutes)}m` : `${hours}h`;
    if (minutes) return secs ? `${minutes}m${two(secs)}s` : `${minutes}m`;
    return `${secs}s`;
  }

  const percent = (fraction) => (isNumber(fraction) ? `${halfUp(fraction * 100)}%` : UNKNOWN);

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

  // iso: the moment for a <time datetime>, in UTC; "" when no calendar shows it
  function iso(epoch) {
    const date = dateOf(epoch);
    return date === null ? "" : date.toISOString().slice(0, 19) + "+00:00";
  }

  // ago: the hub's ISO time (last_activity) as '12 min ago'
  function ago(text, now) {
    if (!text) return "never";
    const when = Date.parse(String(text).replace(/(\.\d{3})\d+/, "$1"));
    if (Number.isNaN(when)) return "never";
    const seconds = Math.max(0, now - when / 1000);
    if (seconds < 60) return "just now";
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    return `${Math.floor(seconds / 86400)} days ago`;
  }

  // isolate: a name someone chose, between FIRST STRONG ISOLATE and POP DIRECTIONAL
  // ISOLATE, for plain text (an <option>, a sentence): its bidi controls stay inside it
  const isolate = (name) => `\u2068${name}\u2069`;

  root.QuotaFormat = Object.freeze({ UNKNOWN, isNumber, halfUp, size, duration, percent,
                                     moment, iso, ago, isolate });
})(globalThis);
