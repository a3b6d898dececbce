"""The SGD training step the compare tests' dumped runs take (runs.py, planted.py, autocast_plants.py):
start the debugger, forward and loss, zero_grad, backward, optimizer step, stop, step; close at the end."""


def train_dumped(debugger, model, opt, loss_of, batches, rank=0):
    """One step per item of `batches` (each a tuple of `loss_of`'s arguments, drawn before the debugger
    starts, so making a batch is never dumped); the debugger is closed at the end, also on error (its
    writer threads end with it)."""
    try:
        for batch in batches:
            debugger.start(model, rank_id=rank)
            loss = loss_of(*batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            debugger.stop()
            debugger.step()
    finally:
        debugger.close()
