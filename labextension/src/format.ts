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

/** The monitor's answer; only the fields the item reads. */
export interface IGpuMetrics {
  status: 'ok' | 'no_gpu' | 'error' | 'starting';
  message: string;
  interval: number;
  warning_threshold: number;
  gpu_memory_limit: number | null;
  gpus: IGpuReport[];
  warning: string | null;
}

/** What to render. `visible: false` hides the whole item. */
export interface IView {
  visible: boolean;
  text: string;
  title: string;
  warning: boolean;
  error: boolean;
}

const GiB = 1024 ** 3;
const CLICK_HINT = 'Click to open the GPU usage page.';

export const HIDDEN: IView = {
  visible: false,
  text: '',
  title: '',
  warning: false,
  error: false
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

/** The item for an error: `GPU ?`, the reason in the tooltip. */
export function errorView(reason: string): IView {
  return {
    visible: true,
    text: 'GPU ?',
    title: `${reason}\n${CLICK_HINT}`,
    warning: false,
    error: true
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
 */
export function viewOf(metrics: IGpuMetrics): IView {
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
    error: false
  };
}
