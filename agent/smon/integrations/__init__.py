"""One-line SMon for the frameworks people train with (each an optional extra of `smon`).

- `smon.integrations.transformers.SMonCallback`: Hugging Face `Trainer(callbacks=[SMonCallback()])`
- `smon.integrations.lightning.SMonCallback`: `lightning.pytorch.Trainer(callbacks=[SMonCallback()])`
- `smon.integrations.accelerate.attach(accelerator)`: after `accelerator.prepare(...)`
- `smon.integrations.deepspeed.attach(engine)`: after `deepspeed.initialize(...)`
- `smon.integrations.torchtitan.attach(trainer)` / `SMonTrainer`: torchtitan's Trainer

Importing `smon` (or this package) imports none of the frameworks: each module imports its own
framework only when it is imported or used. See docs/integrations.md.
"""
