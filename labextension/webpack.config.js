// Extra webpack settings for `jupyter labextension build` (package.json:
// jupyterlab.webpackConfig). They make the build independent of where the
// checkout lives: webpack's deterministic module ids hash each module's
// identifier with absolute paths made relative, except for the module-federation
// container, whose identifier is a JSON list of absolute paths. That module gets
// its id here from its identifier with this folder's path taken out.
const crypto = require('crypto');

class StableContainerIdPlugin {
  apply(compiler) {
    compiler.hooks.compilation.tap('StableContainerIdPlugin', compilation => {
      compilation.hooks.beforeModuleIds.tap('StableContainerIdPlugin', modules => {
        for (const module of modules) {
          const identifier = module.identifier();
          if (!identifier.startsWith('container entry')) {
            continue;
          }
          const relative = identifier.split(__dirname).join('.');
          const digest = crypto.createHash('sha256').update(relative).digest();
          compilation.chunkGraph.setModuleId(module, digest.readUInt32BE(0) % 1000);
        }
      });
    });
  }
}

module.exports = {
  plugins: [new StableContainerIdPlugin()]
};
