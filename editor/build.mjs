// Builds src/editor.js into ONE file, ../spawner/webapp/static/editor.js (committed), with
// the licenses of what it bundles in editor.js.LICENSE.txt. Reproducible: pinned versions
// (package-lock.json), no timestamps, no source map, the same esbuild.
//
// codemirror-json-schema renders schema descriptions with markdown-it and highlights code
// with shiki, which loads themes, grammars and a WebAssembly engine; the editor needs none
// of that, so its utils/markdown.js is replaced by src/markdown.js (markdown-it only, raw
// HTML off, so a description is shown as text).
import { build } from "esbuild";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(here, "..", "spawner", "webapp", "static");
mkdirSync(out, { recursive: true });

const noShiki = {
  name: "no-shiki",
  setup(b) {
    b.onResolve({ filter: /utils\/markdown(\.js)?$/ }, (args) =>
      args.importer.includes("codemirror-json-schema")
        ? { path: join(here, "src", "markdown.js") } : undefined);
  },
};

const result = await build({
  entryPoints: [join(here, "src", "editor.js")],
  bundle: true,
  format: "iife",
  target: ["es2020"],
  minify: true,
  legalComments: "none",
  metafile: true,
  outfile: join(out, "editor.js"),
  plugins: [noShiki],
  logLevel: "warning",
});

// one license file: every package with a file in the bundle, in name order
const packages = new Map();
for (const input of Object.keys(result.metafile.inputs)) {
  const m = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (m && !packages.has(m[1])) packages.set(m[1], join(here, "node_modules", m[1]));
}
const parts = ["Third-party software bundled in editor.js (built from editor/ by `make editor`)."];
for (const name of [...packages.keys()].sort()) {
  const dir = packages.get(name);
  const meta = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  let text = "";
  for (const file of ["LICENSE", "LICENSE.md", "LICENSE.txt", "license", "LICENCE"]) {
    try { text = readFileSync(join(dir, file), "utf8").trim(); break; } catch { /* next */ }
  }
  parts.push(`${"-".repeat(72)}\n${name} ${meta.version} (${meta.license ?? "see below"})\n\n` +
             (text || `License: ${meta.license}`));
}
writeFileSync(join(out, "editor.js.LICENSE.txt"), parts.join("\n\n") + "\n");
