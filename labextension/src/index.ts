/**
 * @quota-spawner/gpu-status: this server's GPU usage in JupyterLab's status bar.
 *
 * Reads GET {base_url}api/gpu/metrics of the server extension spawner.monitor
 * (docs/gpu-monitor.md). That handler does not count as user activity, so the
 * polling here does not either; it pauses while the browser tab is hidden.
 * While the hub preempts the server (the answer's `preemption`), the item
 * counts down to the stop and a notification says so, once per notice.
 * Where the home has a size, a second item shows its use against it (the
 * answer's `home`), and a notification says so once each time it is full.
 * Docs: docs/jupyterlab-status-bar.md. The package's second plugin is in
 * launcher.ts.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
// A core package of JupyterLab (shared, not bundled); Notification since 4.0.
import { Notification } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  errorView,
  HIDDEN,
  HOME_FULL_MESSAGE,
  HOME_ROOM_MESSAGE,
  homeFull,
  homeOf,
  homeView,
  IGpuMetrics,
  IView,
  preemptionKey,
  preemptionMessage,
  preemptionOf,
  viewOf
} from './format';
import { earlyLauncher } from './launcher';

/** The status item's id in the status bar. */
export const STATUS_ITEM_ID = 'quota-spawner:gpu-status';
/** The item's DOM id and class. */
export const ITEM_CLASS = 'qs-gpu-status';
/** On the item while some GPU's memory is at or above the warning threshold. */
export const WARNING_CLASS = 'qs-gpu-status-warning';
/** On the item while it shows `GPU ?`. */
export const ERROR_CLASS = 'qs-gpu-status-error';
/** The span holding the text. */
export const TEXT_CLASS = 'qs-gpu-status-text';
/** On the item while the server is being preempted. */
export const PREEMPTED_CLASS = 'qs-gpu-status-preempted';

/** The home item's id in the status bar. */
export const HOME_ITEM_ID = 'quota-spawner:home-status';
/** The home item's DOM id and class. */
export const HOME_CLASS = 'qs-home-status';
/** On the home item while the home is full (or at 90% of its size). */
export const HOME_WARNING_CLASS = 'qs-home-status-warning';
/** On the home item while its use is unknown. */
export const HOME_ERROR_CLASS = 'qs-home-status-error';
/** The home item's text span. */
export const HOME_TEXT_CLASS = 'qs-home-status-text';

/** Seconds between requests: max(the monitor's interval, this). */
const MIN_INTERVAL_S = 2;
/** Seconds between checks while hidden (no GPU, or no monitor: HTTP 404). */
const HIDDEN_INTERVAL_S = 60;
/** The longest wait after failed requests (the wait doubles per failure). */
const MAX_BACKOFF_S = 30;
/** Seconds between requests on a server with a home of a size but no GPU. */
const HOME_INTERVAL_S = 5;

function reason(error: unknown): string {
  if (error instanceof Error && error.message) {
    return error.message;
  }
  return String(error);
}

/** The status-bar widget: a text span, polling the monitor while the tab is visible. */
export class GpuStatus extends Widget {
  constructor(settings: ServerConnection.ISettings) {
    super();
    this._settings = settings;
    this.id = ITEM_CLASS;
    this.addClass(ITEM_CLASS);
    this.addClass('jp-StatusBar-GroupItem');
    this.addClass('jp-mod-highlighted');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this._text = document.createElement('span');
    this._text.className = `jp-StatusBar-TextItem ${TEXT_CLASS}`;
    this.node.appendChild(this._text);
    this.node.addEventListener('click', this);
    this.node.addEventListener('keydown', this);
    document.addEventListener('visibilitychange', this);
    this._schedule(0);
  }

  /** Whether the status bar should show the item. */
  get isActive(): boolean {
    return this._view.visible;
  }

  /** Emitted when isActive changes. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  /** Each answer of the monitor; null when it is not loaded (HTTP 404). */
  get answered(): ISignal<this, IGpuMetrics | null> {
    return this._answered;
  }

  /** What the item shows now. */
  get view(): IView {
    return this._view;
  }

  /** The URL of the GPU usage page. */
  static pageUrl(): string {
    return URLExt.join(PageConfig.getBaseUrl(), 'gpu');
  }

  handleEvent(event: Event): void {
    switch (event.type) {
      case 'click':
        this._open();
        break;
      case 'keydown': {
        const key = (event as KeyboardEvent).key;
        if (key === 'Enter' || key === ' ') {
          event.preventDefault();
          this._open();
        }
        break;
      }
      case 'visibilitychange':
        if (document.hidden) {
          this._clearTimer();
        } else {
          this._schedule(0);
        }
        break;
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._clearTimer();
    this._stopCountdown();
    document.removeEventListener('visibilitychange', this);
    this.node.removeEventListener('click', this);
    this.node.removeEventListener('keydown', this);
    Signal.clearData(this);
    super.dispose();
  }

  private _open(): void {
    window.open(GpuStatus.pageUrl(), '_blank');
  }

  private _clearTimer(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
  }

  /** The next request in `seconds`; none while the tab is hidden. */
  private _schedule(seconds: number): void {
    this._clearTimer();
    if (this.isDisposed || document.hidden) {
      return;
    }
    this._timer = window.setTimeout(() => {
      this._timer = null;
      void this._tick();
    }, seconds * 1000);
  }

  private async _tick(): Promise<void> {
    if (this._inFlight) {
      return; // the request under way schedules the next one
    }
    this._inFlight = true;
    let next: number;
    try {
      next = await this._fetch();
    } finally {
      this._inFlight = false;
    }
    this._schedule(next);
  }

  /** One request; returns the seconds until the next. */
  private async _fetch(): Promise<number> {
    const url = URLExt.join(this._settings.baseUrl, 'api/gpu/metrics');
    let response: Response;
    let body: IGpuMetrics;
    try {
      response = await ServerConnection.makeRequest(
        url,
        { method: 'GET', cache: 'no-store' },
        this._settings
      );
      if (response.status === 404) {
        // the monitor is not loaded on this server: no item
        this._failures = 0;
        this._stopCountdown();
        this._show(HIDDEN);
        this._answered.emit(null);
        return HIDDEN_INTERVAL_S;
      }
      if (!response.ok) {
        return this._fail(`HTTP ${response.status}`);
      }
      body = (await response.json()) as IGpuMetrics;
    } catch (error) {
      return this._fail(reason(error));
    }
    if (body === null || typeof body !== 'object') {
      return this._fail('not a GPU monitor answer');
    }
    this._failures = 0;
    this._answer = body;
    this._preemption(body);
    this._show(this._viewNow());
    this._answered.emit(body);
    if (body.status === 'no_gpu' && preemptionOf(body) === null) {
      return homeOf(body) === null ? HIDDEN_INTERVAL_S : HOME_INTERVAL_S;
    }
    const interval = Number(body.interval);
    return Number.isFinite(interval) ? Math.max(interval, MIN_INTERVAL_S) : MIN_INTERVAL_S;
  }

  /** The view of the last answer, with the countdown at this moment. */
  private _viewNow(): IView {
    if (this._answer === null) {
      return HIDDEN;
    }
    if (preemptionOf(this._answer) === null) {
      return viewOf(this._answer);
    }
    const left = Math.max(0, (this._deadline - Date.now()) / 1000);
    return viewOf(this._answer, left, this._stopsAt());
  }

  /** The deadline as a local time, e.g. `4:42:06 PM`. */
  private _stopsAt(): string {
    return new Date(this._deadline).toLocaleTimeString();
  }

  /**
   * Follows the answer's preemption: the deadline on this browser's clock (from
   * seconds_left: the clocks may differ), the countdown, and the notification.
   */
  private _preemption(body: IGpuMetrics): void {
    const p = preemptionOf(body);
    if (p === null) {
      this._stopCountdown();
      if (this._notificationId !== null) {
        if (Date.now() < this._deadline) {
          // the notice is gone before the deadline: the hub called it off
          Notification.update({
            id: this._notificationId,
            message: 'The preemption was called off: this server keeps running.',
            type: 'success',
            autoClose: 10000,
            actions: []
          });
        } else {
          // the server was stopped, and this is a new one
          Notification.dismiss(this._notificationId);
        }
      }
      this._notified = null;
      this._notificationId = null;
      return;
    }
    this._deadline = Date.now() + Math.max(0, Number(p.seconds_left) || 0) * 1000;
    if (this._countdown === null) {
      this._countdown = window.setInterval(() => this._show(this._viewNow()), 1000);
    }
    const key = preemptionKey(p);
    if (key !== this._notified) {
      this._notified = key;
      if (this._notificationId !== null) {
        Notification.dismiss(this._notificationId);
      }
      this._notificationId = Notification.warning(preemptionMessage(p, this._stopsAt()), {
        autoClose: false,
        actions: [
          {
            label: 'Details',
            caption: 'Open the GPU usage page',
            callback: () => this._open()
          }
        ]
      });
    }
  }

  private _stopCountdown(): void {
    if (this._countdown !== null) {
      window.clearInterval(this._countdown);
      this._countdown = null;
    }
  }

  private _fail(why: string): number {
    this._failures += 1;
    if (this._countdown === null) {
      this._show(errorView(`Could not read the GPU usage: ${why}`));
    } // while preempted the countdown goes on: at the deadline the server stops answering
    return Math.min(MIN_INTERVAL_S * 2 ** (this._failures - 1), MAX_BACKOFF_S);
  }

  private _show(view: IView): void {
    if (this.isDisposed) {
      return;
    }
    const wasActive = this._view.visible;
    this._view = view;
    this._text.textContent = view.text; // text only: it holds server data
    this.node.title = view.title;
    this.toggleClass(WARNING_CLASS, view.warning);
    this.toggleClass(ERROR_CLASS, view.error);
    this.toggleClass(PREEMPTED_CLASS, view.preempted);
    if (wasActive !== view.visible) {
      this._activeStateChanged.emit(); // the status bar shows or hides the item
    }
  }

  private _settings: ServerConnection.ISettings;
  private _text: HTMLSpanElement;
  private _view: IView = HIDDEN;
  private _timer: number | null = null;
  private _inFlight = false;
  private _failures = 0;
  /** The last successful answer. */
  private _answer: IGpuMetrics | null = null;
  /** While preempted: the deadline in Date.now() milliseconds. */
  private _deadline = 0;
  /** The one-second countdown timer, while preempted. */
  private _countdown: number | null = null;
  /** The notice notified (preemptionKey), and its notification. */
  private _notified: string | null = null;
  private _notificationId: string | null = null;
  private _activeStateChanged = new Signal<this, void>(this);
  private _answered = new Signal<this, IGpuMetrics | null>(this);
}

/**
 * The home's use against its size, from the GPU item's answers (one request for
 * both). Hidden where the home has no size. When the home is full, a
 * notification says how to free room, once until it has room again.
 */
export class HomeStatus extends Widget {
  constructor(source: GpuStatus) {
    super();
    this.id = HOME_CLASS;
    this.addClass(HOME_CLASS);
    this.addClass('jp-StatusBar-GroupItem');
    this.addClass('jp-mod-highlighted');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this._text = document.createElement('span');
    this._text.className = `jp-StatusBar-TextItem ${HOME_TEXT_CLASS}`;
    this.node.appendChild(this._text);
    this.node.addEventListener('click', this);
    this.node.addEventListener('keydown', this);
    source.answered.connect(this._onAnswer, this);
  }

  /** Whether the status bar should show the item. */
  get isActive(): boolean {
    return this._view.visible;
  }

  /** Emitted when isActive changes. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  handleEvent(event: Event): void {
    const key = event.type === 'keydown' ? (event as KeyboardEvent).key : '';
    if (event.type === 'click' || key === 'Enter' || key === ' ') {
      event.preventDefault();
      window.open(GpuStatus.pageUrl(), '_blank');
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.node.removeEventListener('click', this);
    this.node.removeEventListener('keydown', this);
    Signal.clearData(this);
    super.dispose();
  }

  private _onAnswer(_: GpuStatus, body: IGpuMetrics | null): void {
    const view = homeView(body);
    const wasActive = this._view.visible;
    this._view = view;
    this._text.textContent = view.text; // text only: it holds server data
    this.node.title = view.title;
    this.toggleClass(HOME_WARNING_CLASS, view.warning);
    this.toggleClass(HOME_ERROR_CLASS, view.error);
    if (wasActive !== view.visible) {
      this._activeStateChanged.emit();
    }
    const home = homeOf(body);
    if (home !== null) {
      this._notify(homeFull(home));
    }
  }

  /** Once per full home: told when it fills, and when it has room again. */
  private _notify(full: boolean): void {
    if (full && this._notificationId === null) {
      this._notificationId = Notification.warning(HOME_FULL_MESSAGE, {
        autoClose: false,
        actions: [
          {
            label: 'Details',
            caption: 'Open the usage page',
            callback: () => window.open(GpuStatus.pageUrl(), '_blank')
          }
        ]
      });
    } else if (!full && this._notificationId !== null) {
      Notification.update({
        id: this._notificationId,
        message: HOME_ROOM_MESSAGE,
        type: 'success',
        autoClose: 10000,
        actions: []
      });
      this._notificationId = null;
    }
  }

  private _text: HTMLSpanElement;
  private _view: IView = HIDDEN;
  /** The notification of the full home, while it is full. */
  private _notificationId: string | null = null;
  private _activeStateChanged = new Signal<this, void>(this);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@quota-spawner/gpu-status:plugin',
  description: "Shows this server's GPU usage in the status bar.",
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null): void => {
    if (!statusBar) {
      return; // e.g. Notebook 7, which has no status bar
    }
    const item = new GpuStatus(app.serviceManager.serverSettings);
    statusBar.registerStatusItem(STATUS_ITEM_ID, {
      item,
      align: 'left',
      rank: 1000, // after the other items on the left
      isActive: () => item.isActive,
      activeStateChanged: item.activeStateChanged
    });
    const home = new HomeStatus(item);
    statusBar.registerStatusItem(HOME_ITEM_ID, {
      item: home,
      align: 'left',
      rank: 1001, // after the GPU item
      isActive: () => home.isActive,
      activeStateChanged: home.activeStateChanged
    });
  }
};

export default [plugin, earlyLauncher];
