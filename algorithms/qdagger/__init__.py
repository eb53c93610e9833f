"""QDagger (Agarwal et al. 2022, "Reincarnating Reinforcement Learning"): a DQN student that starts from a
finished DQN run (`--teacher`): offline distillation on the teacher's replay, then online DQN with a decaying
distillation coefficient. It shares DQN's replay items and actor-side writer (`rlfleet.algorithms.dqn`).

The folder holds `config` (DQN's settings plus the reincarnation ones), `teacher` (checking and loading a
teacher run directory), `agent` (`QDaggerAgent`: both phases and the coefficient's schedule) and `methods` (the
paper's alternatives, as algorithms of their own: kickstarting, pretrain_finetune, rehearsal, dqfd).
"""

from rlfleet.algorithms import register
from rlfleet.algorithms.qdagger import methods
from rlfleet.algorithms.qdagger.builder import TEACHER, QDagger

__all__ = ["TEACHER", "QDagger", "methods"]

register(QDagger())
methods.register_all()
