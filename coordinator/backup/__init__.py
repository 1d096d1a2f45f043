"""One backup of a whole ring (`BackupWorkflow.run`, the protocol, in workflow.py).

- model.py: what a run is given and learns (`BackupRun`, settings, targets) and its errors;
- plan.py: who and what is backed up, decided from the agents' and arrays' answers (pure);
- freeze.py: the freeze barrier (freeze under leases, renew, thaw always, the window);
- arrays.py: the arrays' side of one run (prepare, commit within the budget, finish; on failure
  abort, delete, and what is left running or left behind);
- tasks.py: waiting on what a run starts (bounded, to completion, triage of a task);
- daemon.py: the daemon's runs, request to catalog record, and the recovery of interrupted ones.
"""

from ringsnap.coordinator.backup.model import (
    BackupFailed,
    BackupRefused,
    BackupRun,
    BackupSettings,
    NodeOutcome,
    NodeTarget,
    Progress,
    new_backup_id,
)
from ringsnap.coordinator.backup.workflow import BackupWorkflow

__all__ = [
    "BackupFailed",
    "BackupRefused",
    "BackupRun",
    "BackupSettings",
    "BackupWorkflow",
    "NodeOutcome",
    "NodeTarget",
    "Progress",
    "new_backup_id",
]
