"""Read a log directory the way TensorBoard's HPARAMS tab does: through the hparams plugin's own handlers."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def hparams_tab(logdir: Path) -> dict[str, Any]:
    """What the HPARAMS tab would show for `logdir`: hparam names, metric tags, and one row per session.

    Built with TensorBoard's event multiplexer and data provider, and the hparams plugin's
    GetExperiment and ListSessionGroups handlers (the requests the tab's table makes).
    """
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    tb_context = base_plugin.TBContext(
        logdir=str(logdir),
        multiplexer=multiplexer,
        data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)),
    )
    backend = backend_context.Context(tb_context)
    ctx = context.RequestContext()
    experiment = get_experiment.Handler(ctx, backend, "", api_pb2.GetExperimentRequest(include_metrics=True)).run()
    request = api_pb2.ListSessionGroupsRequest(
        allowed_statuses=[api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE],
        start_index=0,
        slice_size=10_000,
        aggregation_type=api_pb2.AGGREGATION_AVG,
    )
    for info in experiment.hparam_infos:
        request.col_params.add(hparam=info.name)
    for info in experiment.metric_infos:
        request.col_params.add(metric=info.name)
    groups = list_session_groups.Handler(ctx, backend, "", request).run()

    def value(v) -> Any:
        kind = v.WhichOneof("kind")
        return getattr(v, kind) if kind else None

    return {
        "hparams": {info.name: info for info in experiment.hparam_infos},
        "metrics": [info.name.tag for info in experiment.metric_infos],
        "sessions": {
            group.name: {
                "hparams": {k: value(v) for k, v in group.hparams.items()},
                "metrics": {m.name.tag: m.value for m in group.metric_values},
            }
            for group in groups.session_groups
        },
    }
