"""Run-config section ``data``: the task, its dataset, how it is split, and sizes."""

from __future__ import annotations

from dataclasses import dataclass

from server_app.config.section import Section
from server_app.config.values import MAX_CLIENTS, ConfigError, bad
from task.config import DATASETS, MAX_PARTITION_ALPHA, PARTITIONS
from task.registry import check_spec, is_plugin, task_spec
from task.tasks import BUILTIN_TASKS


@dataclass(frozen=True)
class DataConfig(Section):
    """The learning task and its data (keys ``task``, ``dataset`` ... ``block-size``).

    Attributes
    ----------
    task : str
        ``""`` (the built-in task named by ``dataset``), a built-in name, or
        ``package.module:factory`` (:mod:`task.registry`); only its form is
        checked here, the import and the task's parts in
        :func:`server_app.preflight.check_run`.
    dataset : str
        A built-in task's name (:data:`task.tasks.BUILTIN_TASKS`, read when
        ``task`` is ``""``); default: the registry's first, as pyproject.toml's.
    data_dir : str
        Where the dataset is ('' = looked up, :func:`task.locate.resolve_data_dir`).
    partition : str
        One of :data:`task.config.PARTITIONS`.
    partition_alpha : float
        Dirichlet concentration of ``partition = 'dirichlet'``.
    classes_per_client : int
        Classes per client of ``partition = 'pathological'``.
    num_clients : int
        C, every client that ever exists (one SuperNode each).
    client_samples, test_samples : int
        Samples per client / test samples (0 = all).
    block_size : int
        Characters per text sample (Tiny Shakespeare; the task checks its range).
    client_data : bool
        Every client reads its own data folder (node-config ``client-data``,
        docs/DEPLOY.md): the server then reads only the task's test split
        (:func:`server_app.config.tasks.load_run_data`), takes each client's size
        from the ``num-records`` its node reports at discovery, and the settings
        that need the clients' training data on the server are refused
        (:meth:`refuse_without_train`).
    """

    task: str = ""
    dataset: str = DATASETS[0]
    data_dir: str = ""
    partition: str = "iid"
    partition_alpha: float = 0.5
    classes_per_client: int = 2
    num_clients: int = 100
    client_samples: int = 0
    test_samples: int = 0
    block_size: int = 64
    client_data: bool = False

    def validate(self) -> None:
        """Raise :class:`ConfigError` on the first bad value (naming key and value)."""
        names = tuple(BUILTIN_TASKS)  # the registry as it is now
        if self.dataset not in names:
            raise bad("dataset", self.dataset, f"one of {', '.join(names)}")
        try:
            check_spec(self.task_spec, builtins=names)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.partition not in PARTITIONS:
            raise bad("partition", self.partition, f"one of {', '.join(PARTITIONS)}")
        self.check_positive("num-clients", "block-size")
        for key in ("client-samples", "test-samples"):
            value = getattr(self, key.replace("-", "_"))
            if value < 0:
                raise bad(key, value, "0 (all) or a positive integer")
        self.check_bounds()
        if self.num_clients > MAX_CLIENTS:
            raise bad("num-clients", self.num_clients,
                      f"at most {MAX_CLIENTS} (one SuperNode and at least one "
                      "training sample each)")
        self._validate_partition()

    @property
    def task_spec(self) -> str:
        """The task the run names: ``task``, or ``dataset`` when ``task`` is ``""``."""
        return task_spec(self.task, self.dataset)

    @property
    def plugin(self) -> bool:
        """Whether the task is a plug-in (``package.module:factory``)."""
        return is_plugin(self.task_spec)

    @property
    def task_label(self) -> str:
        """The task's spec as a folder-name part (``:`` becomes ``.``)."""
        return self.task_spec.replace(":", ".")

    def _validate_partition(self) -> None:
        if not 0 < self.partition_alpha <= MAX_PARTITION_ALPHA:
            raise bad("partition-alpha", self.partition_alpha,
                      f"a finite number in (0, {MAX_PARTITION_ALPHA:g}] (Dirichlet "
                      "concentration of partition='dirichlet'; smaller = more skewed)")
        if self.classes_per_client < 1:
            raise bad("classes-per-client", self.classes_per_client,
                      "a positive integer, at most the task's classes (10), used by "
                      "partition='pathological'")

    def refuse_without_train(self, key: str, value: object, why: str) -> None:
        """Refuse ``key`` = ``value`` when ``client-data`` is true.

        The server then holds no client's training data; ``why``: what the
        setting reads.

        Raises
        ------
        ConfigError
            One line naming ``key``, ``client-data`` and ``why``.
        """
        if self.client_data:
            raise bad(key, value, f"off with client-data = true: {why}, and the "
                      "server holds no client's training data (every client reads "
                      "its own folder)")
