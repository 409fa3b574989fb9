"""User-facing errors and the CLI's exit codes.

Exit codes of every `jaxrl` command:

    0    success
    1    an unexpected failure (a bug): Python's traceback
    2    a user mistake (`UserError`: bad config, path, checkpoint, a run dir locked by another trainer, an
         environment that broke its contract); one line on stderr
    75   `train` stopped by SIGTERM (preemption) after saving a checkpoint: resumable; `jaxrl launch`
         restarts it (75 is sysexits' EX_TEMPFAIL, "try again later")
    130  stopped by SIGINT (Ctrl-C); `train` saved a checkpoint first when the signal arrived during training
         steps, so running the same command again resumes (128 + 2, the shell's convention)
"""

EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Bad input from the user: a config key, a path, a tensor shape.

    The message says what was wrong, where, and what is allowed."""


class ConfigError(UserError):
    """An invalid configuration value or key."""


class CheckpointError(UserError):
    """A missing, malformed or incompatible checkpoint or weights file."""


class RunDirError(UserError):
    """A run or output directory that cannot be used: unwritable, a file, locked, or holding foreign files."""


class OutputDirError(CheckpointError):
    """An export / import output directory that must not be written: a run or checkpoint directory, foreign
    files, or an existing directory without --overwrite."""


class EnvError(UserError):
    """An environment (`jaxrl.envs.Env`) broke its contract: reset / step / demonstration returned the wrong
    type, empty or out-of-vocabulary token ids, a non-finite reward, or step raised or ran past
    `env.step_timeout_s`. The message names the class, the method, the record and turn, and what was
    expected."""
