// Stands in for codemirror-json-schema's utils/markdown.js (see build.mjs): markdown-it
// without shiki, raw HTML off, so a schema description can never add markup.
import md from "markdown-it";

const renderer = md({ html: false, linkify: false, typographer: false });

export function renderMarkdown(markdown, inline = true) {
  return inline ? renderer.renderInline(markdown) : renderer.render(markdown);
}
