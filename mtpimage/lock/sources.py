"""The fetched source trees of a plan's components (git through the one fetcher, gitfetch.py;
PyPI through pydeps.py), memoized for the probes and the lock run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtpimage import gitfetch
from mtpimage.errors import BuilderError
from mtpimage.lock import pydeps


@dataclass
class SourceSet:
    """Fetched trees of a plan's components, memoized; offline sources remembered, not raised.

    With keep_going (`check --probe-sources`), a source that answered with an error (a
    missing commit, a refused connection) is remembered in `failed` instead of raised: the
    probes of every other source still run, and the rules needing this one are UNKNOWN."""

    indexes: dict[str, str] = field(default_factory=dict)  # index name -> URL
    trees: dict[str, Path] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # component -> reason
    fetcher: Callable[[str, str], gitfetch.Tree] | None = None  # default: gitfetch.fetch
    keep_going: bool = False
    failed: dict[str, str] = field(default_factory=dict)  # component -> reason

    def tree(self, comp) -> Path | None:
        """The tree of a plan's Component (git: its subdir; PyPI: its unpacked distribution)."""
        if comp.name in self.trees:
            return self.trees[comp.name]
        if comp.name in self.unavailable or comp.name in self.failed:
            return None
        if comp.source == "git":
            try:
                t = (self.fetcher or gitfetch.fetch)(comp.repo, comp.commit)
            except gitfetch.GitError as exc:
                if exc.offline and self.keep_going:
                    # asked to probe (check --probe-sources): a source nobody could read decides
                    # nothing, so its rules are UNKNOWN, never the known pins' PASS
                    self.failed[comp.name] = (
                        f"{comp.repo} unreachable: {exc.stderr.strip()} (fix: reach {comp.repo}, or serve a "
                        f"mirror of it through git config url.<mirror>.insteadOf {comp.repo})"
                    )
                    return None
                if exc.offline:
                    self.unavailable[comp.name] = f"{comp.repo} unreachable: {exc.stderr}"
                    return None
                if not self.keep_going:
                    raise
                fix = f" (fix: {exc.fix})" if exc.fix else ""
                self.failed[comp.name] = f"{comp.repo} commit {comp.commit[:12]}: git says: {exc.stderr}{fix}"
                return None
            self.trees[comp.name] = t.path / comp.subdir if comp.subdir not in ("", ".") else t.path
            return self.trees[comp.name]
        try:
            path = pydeps.unpacked_dist(comp.package, comp.version, self.indexes[comp.index])
        except pydeps.IndexUnreachable as exc:
            if self.keep_going:
                self.failed[comp.name] = f"{exc} (fix: reach the index, or mirror it with MTP_INDEX_REWRITE)"
                return None
            self.unavailable[comp.name] = str(exc)
            return None
        except BuilderError as exc:
            if not self.keep_going:
                raise
            self.failed[comp.name] = f"{comp.package}=={comp.version}: {exc.one_line()}"
            return None
        self.trees[comp.name] = path
        return path
