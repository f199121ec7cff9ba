"""The suite's fixtures, registered for every test under this root. The rest of
the pytest wiring (options, card parametrization, the run's session object and
its reports) is the npu_conformance.plugin entry point; the machinery is the
npu_conformance package."""

pytest_plugins = (
    "fixtures.checkpoint",
    "fixtures.reference",
    "fixtures.target",
    "fixtures.server",
    "fixtures.perf",
    "fixtures.latency",
    "fixtures.accuracy",
)
