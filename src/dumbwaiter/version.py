"""The package's version, in a module of its own so that modules under the
package (webhooks' User-Agent, tracing's instrumentation scope) read it
without importing the package, which imports everything."""

__version__ = "0.1.0.dev0"
