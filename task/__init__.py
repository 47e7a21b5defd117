"""The ML task shared by both apps (a Flower template's ``task.py``, split by concern).

- :mod:`task.interface`: :class:`~task.interface.Task`, what both apps need from a
  learning task (data, model, local steps, optional parts);
- :mod:`task.tasks`: the built-in tasks, one module each written against it, and
  their one registry (:data:`task.tasks.BUILTIN_TASKS`);
- :mod:`task.registry`: run-config ``task`` (a built-in or ``package.module:factory``,
  both through one import), the task's data and a client's share;
- :mod:`task.builtin`: the built-ins by name (shortcuts for scripts and tests);
- :mod:`task.device`: run-config ``device``;
- :mod:`task.membership`: the membership audit's default attack features;
- :mod:`task.config`: the choices (datasets, partitions, optimizers), their checks,
  :class:`~task.config.TaskConfig` and ``pyproject.toml``'s run-config defaults;
- :mod:`task.locate`: where a built-in's files are (explicit folder, usual places,
  download), from the facts its module gives;
- :mod:`task.data`: loading a whole task once, and each client's share;
- :mod:`task.provenance`: the files a run read and their checksums;
- :mod:`task.partition`: the ``iid`` / ``noniid`` partitions of labelled samples;
- :mod:`task.cifar`: CIFAR-10 from the pickles or the JPEG copy (decoded once);
- :mod:`task.text`: Tiny Shakespeare: vocabulary, blocks, text partitions;
- :mod:`task.model` and :mod:`task.nanogpt`: the CNN and the character GPT
  (each task's module sizes them);
- :mod:`task.train`: local training, prediction and scores (plain PyTorch).

Nothing here imports an app.
"""
