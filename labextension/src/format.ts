/**
 * What the status-bar item shows for one answer of GET {base_url}api/gpu/metrics
 * (docs/gpu-metrics.schema.json). Pure functions, no DOM: see index.ts.
 */

/** One entry of `gpus`: a GPU that was read, or one that failed (`error`). */
export interface IGpuReport {
  index: number;
  uuid: string;
  errors?: Record<string, string>;
  name?: string | null;
  memory_used?: number | null;
  memory_total?: number | null;
  utilization?: number | null;
  memory_limit?: number | null;
  memory_limit_source?: 'GPU_MEMORY_LIMIT' | 'total';
  memory_fraction?: number | null;
  warning?: string | null;
  /** Only on a GPU that could not be read at all. */
  error?: string;
}

/**
 * The hub's preemption notice, as the monitor passes it on: the server will be
 * stopped at `deadline` so that `by` gets its GPU (docs/preemption.md).
 */
export interface IPreemption {
  version: number;
  by: string | null;
  by_role: string | null;
  role: string | null;
  gpus: string[];
  reason: string | null;
  signalled_at: number | null;
  deadline: number;
  grace_period: number | null;
  /** Seconds from the answer to the deadline, 0 once passed. */
  seconds_left: number;
}

/**
 * The home's use against its size, where the home has one (docs/disk.md): read by
 * the monitor from the file the hub and the watchdog write.
 */
export interface IHome {
  status: 'ok' | 'unknown';
  message: string;
  used: number | null;
  limit: number;
  fraction: number | null;
  full: boolean | null;
  at: number | null;
  stale: boolean;
  /** The hub's sentence when the home was over its size at the start (a smaller role). */
  over_size: string | null;
}

/** The monitor's answer; only the fields the item reads. */
export interface IGpuMetrics {
  status: 'ok' | 'no_gpu' | 'error' | 'starting';
  message: string;
  interval: number;
  warning_threshold: number;
  gpu_memory_limit: number | null;
  gpus: IGpuReport[];
  warning: string | null;
  /** Null unless the hub is preempting this server (older monitors: absent). */
  preemption?: IPreemption | null;
  /** Null where the home has no size (older monitors: absent). */
  home?: IHome | null;
}

/** What to render. `visible: false` hides the whole item. */
export interface IView {
  visible: boolean;
  text: string;
  title: string;
  warning: boolean;
  error: boolean;
  /** The server is being preempted: the item counts down to the stop. */
  preempted: boolean;
}

const GiB = 1024 ** 3;
const CLICK_HINT = 'Click to open the GPU usage page.';
/** What to do, as on the GPU page's banner. */
export const PREEMPT_ADVICE =
  'Save your work now; kernels that called on_preempt() are saving a checkpoint. ' +
  'Your home folder is kept.';
/** JupyterLab truncates a notification's message at 140 characters. */
const NOTIFICATION_LENGTH = 140;

export const HIDDEN: IView = {
  visible: false,
  text: '',
  title: '',
  warning: false,
  error: false,
  preempted: false
};

function isNumber(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/** `3.1` for 3.1 GiB; `?` when unknown. */
export function gib(bytes: number | null | undefined): string {
  return isNumber(bytes) ? (bytes / GiB).toFixed(1) : '?';
}

/** `45%` for 0.45; `?%` when unknown. */
export function percent(fraction: number | null | undefined): string {
  return isNumber(fraction) ? `${Math.round(fraction * 100)}%` : '?%';
}

/** `45% · 3.1 / 16.0 GiB` */
function reading(gpu: IGpuReport): string {
  return `${percent(gpu.utilization)} · ${gib(gpu.memory_used)} / ${gib(gpu.memory_limit)} GiB`;
}

/** One tooltip line per GPU. */
function describe(gpu: IGpuReport): string {
  const label = `GPU ${gpu.index}${gpu.name ? ` (${gpu.name})` : ''}`;
  if (gpu.error !== undefined) {
    return `${label}: cannot be read: ${gpu.error}`;
  }
  const whose = gpu.memory_limit_source === 'GPU_MEMORY_LIMIT' ? ' (your limit)' : '';
  const share = isNumber(gpu.memory_fraction) ? ` · ${percent(gpu.memory_fraction)}` : '';
  return (
    `${label}: ${percent(gpu.utilization)} utilization, ` +
    `memory ${gib(gpu.memory_used)} GiB of ${gib(gpu.memory_limit)} GiB${whose}${share}`
  );
}

/** The GPU with the highest memory fraction (then utilization), first on ties. */
export function busiest(gpus: IGpuReport[]): IGpuReport | undefined {
  let best: IGpuReport | undefined;
  const key = (g: IGpuReport): [number, number] => [
    isNumber(g.memory_fraction) ? g.memory_fraction : -1,
    isNumber(g.utilization) ? g.utilization : -1
  ];
  for (const gpu of gpus) {
    if (gpu.error !== undefined) {
      continue;
    }
    if (best === undefined) {
      best = gpu;
      continue;
    }
    const [f, u] = key(gpu);
    const [bf, bu] = key(best);
    if (f > bf || (f === bf && u > bu)) {
      best = gpu;
    }
  }
  return best;
}

/** `1:52` for 112 seconds, `1:02:05` for 3725. */
export function clock(seconds: number): string {
  const s = Math.max(0, Math.ceil(isNumber(seconds) ? seconds : 0));
  const two = (n: number): string => String(n).padStart(2, '0');
  const h = Math.floor(s / 3600);
  const m = Math.floor(s / 60) % 60;
  return `${h ? `${h}:${two(m)}` : m}:${two(s % 60)}`;
}

/** The notice, when the answer has a usable one. */
export function preemptionOf(metrics: IGpuMetrics): IPreemption | null {
  const p = metrics.preemption;
  return p && typeof p === 'object' && isNumber(p.deadline) ? p : null;
}

/** Identifies one notice: the same notice in every answer, whatever the time left. */
export function preemptionKey(p: IPreemption): string {
  const notice: Partial<IPreemption> = { ...p };
  delete notice.seconds_left;
  return JSON.stringify(notice);
}

/** `bob needs this server's GPU for the role urgent-debug.` */
function whoNeeds(p: IPreemption): string {
  const gpus = Array.isArray(p.gpus) && p.gpus.length > 1 ? 'GPUs' : 'GPU';
  const role = p.by_role ? ` for the role ${p.by_role}` : '';
  return `${p.by || 'Another user'} needs this server's ${gpus}${role}.`;
}

/** `stops in 1:52`, or `stopping now` once the deadline has passed. */
function stops(left: number): string {
  return left > 0 ? `stops in ${clock(left)}` : 'stopping now';
}

/**
 * The notification, once per notice: when the server stops, and why (cut to
 * what JupyterLab shows; the tooltip and the GPU page have all of it).
 * `stopsAt`: the deadline as a local time, e.g. `4:42:06 PM`.
 */
export function preemptionMessage(p: IPreemption, stopsAt: string): string {
  const message = `This server stops at ${stopsAt}. Save your work. ${p.reason || whoNeeds(p)}`;
  return message.length <= NOTIFICATION_LENGTH
    ? message
    : `${message.slice(0, NOTIFICATION_LENGTH - 1)}…`;
}

/** The item for an error: `GPU ?`, the reason in the tooltip. */
export function errorView(reason: string): IView {
  return {
    visible: true,
    text: 'GPU ?',
    title: `${reason}\n${CLICK_HINT}`,
    warning: false,
    error: true,
    preempted: false
  };
}

/**
 * The item while the server is being preempted: `⚠ preempted: stops in 1:52`,
 * whatever the GPUs read. `left`: seconds to the deadline now (the item
 * counts down between answers); `stopsAt`: the deadline as a local time.
 */
export function preemptionView(
  p: IPreemption,
  left: number,
  stopsAt: string,
  gpuLines: string[] = []
): IView {
  const when =
    left > 0
      ? `This server will be stopped at ${stopsAt} (in ${clock(left)}).`
      : 'This server is being stopped now.';
  const lines = [when, whoNeeds(p)];
  if (p.reason) {
    lines.push(p.reason);
  }
  lines.push(PREEMPT_ADVICE, ...gpuLines, CLICK_HINT);
  return {
    visible: true,
    text: `⚠ preempted: ${stops(left)}`,
    title: lines.join('\n'),
    warning: true,
    error: false,
    preempted: true
  };
}

/**
 * The item for one answer of the monitor.
 *
 * - `no_gpu` (a CPU-only server) and `starting` (no reading yet): hidden.
 * - `error`: `GPU ?` with the monitor's message.
 * - `ok`: `GPU 45% · 3.1 / 16.0 GiB` (utilization · memory used / limit). With
 *   several GPUs, the one with the highest memory fraction, with its index:
 *   `GPU 1: 45% · 15.2 / 16.0 GiB`; the tooltip lists them all.
 * - warning when any GPU's memory_fraction >= warning_threshold; the tooltip
 *   then starts with the monitor's warning sentence.
 * - `preemption` set: `⚠ preempted: stops in 1:52` whatever the status
 *   (preemptionView); `left` and `stopsAt` as there, by default from the answer.
 */
export function viewOf(
  metrics: IGpuMetrics,
  left?: number,
  stopsAt?: string
): IView {
  const preemption = preemptionOf(metrics);
  if (preemption !== null) {
    const secondsLeft = isNumber(left) ? left : Math.max(0, Number(preemption.seconds_left) || 0);
    const gpus = metrics.status === 'ok' && Array.isArray(metrics.gpus) ? metrics.gpus : [];
    return preemptionView(
      preemption,
      secondsLeft,
      stopsAt ?? new Date(Date.now() + secondsLeft * 1000).toLocaleTimeString(),
      gpus.map(describe)
    );
  }
  if (metrics.status === 'no_gpu' || metrics.status === 'starting') {
    return HIDDEN;
  }
  const gpus = Array.isArray(metrics.gpus) ? metrics.gpus : [];
  if (metrics.status !== 'ok') {
    return errorView(`GPU monitor: ${metrics.message || metrics.status || 'not a GPU monitor answer'}`);
  }
  if (gpus.length === 0) {
    return HIDDEN;
  }
  const lines = gpus.map(describe);
  const shown = busiest(gpus);
  if (shown === undefined) {
    return errorView(lines.join('\n'));
  }
  const threshold = isNumber(metrics.warning_threshold) ? metrics.warning_threshold : 0.9;
  const over = gpus.filter(
    g => g.error === undefined && isNumber(g.memory_fraction) && g.memory_fraction >= threshold
  );
  const warning = over.length > 0;
  if (warning) {
    const sentence =
      metrics.warning ||
      over.map(g => g.warning).find(w => !!w) ||
      `GPU memory at ${percent(over[0].memory_fraction)} of the limit`;
    lines.unshift(sentence);
  }
  lines.push(CLICK_HINT);
  const prefix = gpus.length > 1 ? `GPU ${shown.index}: ` : 'GPU ';
  return {
    visible: true,
    text: prefix + reading(shown),
    title: lines.join('\n'),
    warning,
    error: false,
    preempted: false
  };
}

// --- the home ---------------------------------------------------------------

const MiB = 1024 ** 2;
const HOME_CLICK_HINT = 'Click to open the usage page.';
/** What to do when the home is full: the notification and the tooltip say it. */
export const HOME_FULL_ADVICE =
  'Saving is refused until you free room: delete files in the file browser ' +
  '(no trash: the room is freed at once) and clear caches like ~/.cache/pip.';
/** The notification once per full home (at most NOTIFICATION_LENGTH characters). */
export const HOME_FULL_MESSAGE =
  'Your home is full. Delete files in the file browser and clear caches like ' +
  '~/.cache/pip: saving is refused until then.';
/** When a full home has room again. */
export const HOME_ROOM_MESSAGE = 'Your home has room again: saving works.';

/** `18.2` for 18.2 of the unit, `20` for 20.0. */
function amount(bytes: number, unit: number): string {
  return (bytes / unit).toFixed(1).replace(/\.0$/, '');
}

/** `18.2/20 GiB`, or `40/64 MiB` for a home under 1 GiB; `?/20 GiB` when unknown. */
export function homeAmount(used: number | null, limit: number): string {
  const [unit, name] = limit >= GiB ? [GiB, 'GiB'] : [MiB, 'MiB'];
  return `${isNumber(used) ? amount(used, unit) : '?'}/${amount(limit, unit)} ${name}`;
}

/** The home, when the answer has a usable one (a size above 0). */
export function homeOf(metrics: IGpuMetrics | null): IHome | null {
  const h = metrics ? metrics.home : null;
  return h && typeof h === 'object' && isNumber(h.limit) && h.limit > 0 ? h : null;
}

/**
 * Whether the home is full: the monitor says so, or, while its use is unknown,
 * the hub said at the start that it was over its size.
 */
export function homeFull(home: IHome): boolean {
  return home.status === 'ok' ? home.full === true : !!home.over_size;
}

/**
 * The home's item: `Home 18.2/20 GiB`, hidden where the home has no size. Full:
 * `Home full 20.1/20 GiB`, in the warning colour, the advice in the tooltip;
 * the warning colour from 90% of the size (when the watchdog warns) too.
 */
export function homeView(metrics: IGpuMetrics | null): IView {
  const home = homeOf(metrics);
  if (home === null) {
    return HIDDEN;
  }
  const full = homeFull(home);
  const known = home.status === 'ok';
  const shown = homeAmount(known ? home.used : null, home.limit);
  const lines = [
    known
      ? `Your home holds ${shown.replace('/', ' of ')} (${percent(home.fraction)}).`
      : home.message || "The home's use is unknown."
  ];
  if (full) {
    if (home.over_size) {
      lines.push(home.over_size);
    }
    lines.push(HOME_FULL_ADVICE);
  }
  if (known && home.stale) {
    lines.push('Not updated for a while: the watchdog that reads it is not running.');
  }
  lines.push(HOME_CLICK_HINT);
  return {
    visible: true,
    text: full ? `Home full ${shown}` : `Home ${shown}`,
    title: lines.join('\n'),
    warning: full || (known && isNumber(home.fraction) && home.fraction >= 0.9),
    error: !known && !full,
    preempted: false
  };
}
