/**
 * @quota-spawner/gpu-status:early-launcher: the launcher as soon as the layout is
 * restored.
 *
 * JupyterLab opens its launcher only when the URL's route is done, and the route
 * waits for the workspace's debounced save: about 1 s after the page could show
 * it. JupyterLab's own check (`isEmpty('main')` after the route) then finds this
 * launcher and opens none. Turn it off like any plugin:
 * `jupyter labextension disable @quota-spawner/gpu-status:early-launcher`.
 * Docs: docs/jupyterlab-status-bar.md.
 */

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { PageConfig } from '@jupyterlab/coreutils';

export const EARLY_LAUNCHER_ID = '@quota-spawner/gpu-status:early-launcher';
const CREATE_LAUNCHER = 'launcher:create';

/** Whether to open the launcher now: nothing in the main area, no document asked for. */
export function wantsLauncher(
  shell: Pick<ILabShell, 'isEmpty'>,
  treePath: string,
  hasCommand: boolean
): boolean {
  return hasCommand && !treePath && shell.isEmpty('main');
}

export const earlyLauncher: JupyterFrontEndPlugin<void> = {
  id: EARLY_LAUNCHER_ID,
  description: 'Opens the launcher as soon as the layout is restored.',
  autoStart: true,
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, labShell: ILabShell | null): void => {
    if (!labShell) {
      return; // not JupyterLab's shell (Notebook 7): it has its own start page
    }
    // Read now: for /lab/tree/<path> JupyterLab opens <path> after the route, and
    // the file browser rewrites this option as it navigates.
    const treePath = PageConfig.getOption('treePath');
    void app.restored.then(() => {
      // A restored workspace with tabs is not empty; checked and opened in one
      // task, so JupyterLab's check cannot run in between.
      if (wantsLauncher(labShell, treePath, app.commands.hasCommand(CREATE_LAUNCHER))) {
        void app.commands.execute(CREATE_LAUNCHER);
      }
    });
  }
};
