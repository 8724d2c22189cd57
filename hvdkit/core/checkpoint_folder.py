"""File-system steps of the checkpoint store that must survive a crash at any instant (rank 0).

``place`` puts a finished checkpoint under its ``ckpt-`` name, also when the step exists already;
``delete_later`` takes folders out of the ``ckpt-`` namespace at once and frees their disk blocks in
a background thread; ``signature`` tells whether a folder changed since it was last verified.
"""

import os
import shutil
import threading

from .log import get_logger

__all__ = ["fsync_path", "place", "delete_later", "wait_for_deletions", "signature"]

_log = get_logger("checkpoint")
_DELETERS = {}  # root -> the thread deleting that root's pruned checkpoints


def fsync_path(path, directory=False):
    """fsync a file (or, with ``directory``, a folder's entries) so it survives a crash."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def place(tmp, final, older, trash_path):
    """Rename the finished, fsynced folder ``tmp`` in as ``final``; the path it ends under.

    ``older`` lists ``(generation, path)`` of the copies of the same step already there (a step
    saved again after a resume). Then the new copy goes in first under the next generation's name
    ``final.N`` (ranked above the older copies by the store's listing) and the root is fsynced;
    only then are the older copies renamed to ``trash_path()`` names and the new one to ``final``.
    At every instant a complete copy of the step is under a ``ckpt-`` name, so a crash (or a full
    disk) in between loses nothing. Once the new copy is in, a failure only leaves it at ``final.N``.
    """
    root = os.path.dirname(final)
    if not older:
        os.rename(tmp, final)
        fsync_path(root, directory=True)
        return final
    staged = f"{final}.{max(gen for gen, _ in older) + 1}"
    os.rename(tmp, staged)
    fsync_path(root, directory=True)
    try:
        for _, path in older:
            os.rename(path, trash_path())
        os.rename(staged, final)
        fsync_path(root, directory=True)
    except OSError as e:  # the new copy is in place and loads under the name it has
        _log.warning("checkpoint saved as %s; retiring the older copies of its step failed: %s", staged, e)
        return staged
    return final


def _remove_all(paths, previous):
    if previous is not None:
        previous.join()  # one deleter at a time, in order
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def delete_later(root, paths, trash_path, is_trash):
    """Rename ``paths`` under ``root`` to ``trash_path()`` names now, delete them in a thread.

    Paths for which ``is_trash(name)`` holds are out of the way already and only deleted. The
    thread is not a daemon: a process waits for it before exiting; one killed mid-deletion leaves
    a trash folder behind.
    """
    trash = []
    for path in paths:
        if is_trash(os.path.basename(path)):
            trash.append(path)
            continue
        aside = trash_path()
        try:
            os.rename(path, aside)
        except OSError:  # gone already
            continue
        trash.append(aside)
    if trash:
        deleter = threading.Thread(target=_remove_all, args=(trash, _DELETERS.get(root)), daemon=False)
        _DELETERS[root] = deleter
        deleter.start()


def wait_for_deletions(root):
    """Block until what ``delete_later`` took from ``root`` is deleted."""
    deleter = _DELETERS.get(root)
    if deleter is not None:
        deleter.join()


def signature(path):
    """What changes when a checkpoint folder's files change: (name, inode, size, mtime) of each."""
    try:
        return tuple(sorted((e.name, e.inode(), e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(path)))
    except OSError:
        return None
