"""TensorBoard event files of the monitor: one scalar per (row, op), tag `{prefix}_{op}`.

Uses tensorboard's own event-file writer and protobufs (no torch, no tensorflow). Must not import torch
or mindspore.
"""

import math
import time


class MonitorTensorBoardWriter:
    """Appends a step's rows as scalars to an events file in the rank directory.

    Args:
        rank_dir: where the `events.out.tfevents.*` file goes.
        rank: used in the tags (`0:blocks.0.fc1.output:0/rank0/actv_norm`).
        ops: op names, in the order of each row's values.
    """

    def __init__(self, rank_dir, rank, ops):
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._summary_pb2 = summary_pb2
        self.writer = EventFileWriter(rank_dir, flush_secs=30)
        self.rank = rank
        self.ops = tuple(ops)

    def write_step(self, rows):
        from tensorboard.compat.proto import event_pb2

        if not rows:
            return
        Value = self._summary_pb2.Summary.Value
        values = []
        for row in rows:
            prefix = row.tb_tag(self.rank)
            for op, v in zip(self.ops, row.values):
                values.append(Value(tag=f"{prefix}_{op}", simple_value=v if v is not None else math.nan))
        event = event_pb2.Event(wall_time=time.time(), step=rows[0].step, summary=self._summary_pb2.Summary(value=values))
        self.writer.add_event(event)

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()
