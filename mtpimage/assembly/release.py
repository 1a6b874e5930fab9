"""Publish a tested image: local tags, then push, verify and move, and the roll-back.

The order is the contract users rely on:
  1. the image is tagged only after its checks passed (the pipeline's job);
  2. the content tag (`<profile>-<hash>`) is pushed first and verified in the registry;
  3. only then the tag users pull (`<profile>`) moves, and is verified to name the same digest.
A push that fails removes what this run tagged, locally and in the registry, and puts
`<profile>` back where it pointed: a failed run leaves no new tag anywhere.

Pushes retry under the network policy (netpolicy.py): docker retries blob uploads itself
but not the manifest PUT that ends a push, so the whole push is re-run (blobs already
there are skipped) on anything but a refusal that cannot pass.
"""

from __future__ import annotations

from collections.abc import Callable

from mtpimage import engine, netpolicy
from mtpimage.errors import EnvironmentProblem, last_words
from mtpimage.imageref import Registry
from mtpimage.publish.registryclient import RegistryClient

Say = Callable[[str], None]

PushFailed = engine.PushFailed  # raised by the engine; its `transient` decides a retry


# ----------------------------------------------------------------------------- local tags
def local_tags(eng: engine.ContainerEngine, refs) -> dict[str, str | None]:
    """{ref: the image ID it names in the local engine, or None}: what restore_local_tags puts
    back should the run fail."""
    return {ref: eng.image_id(ref) for ref in refs}


def restore_local_tags(eng: engine.ContainerEngine, before: dict[str, str | None]) -> list[str]:
    """Put each local tag back on the image it named before (None: remove it): the one roll-back
    of local tags, for the main job and for publish. Best effort: returns what was done, one
    note per tag, and never raises (the original error matters)."""
    notes = []
    for ref, prev in before.items():
        try:
            if eng.image_id(ref) == prev:
                continue
            if prev is None:
                eng.untag(ref)
                notes.append(f"removed the new local tag {ref}")
            else:
                eng.tag(prev, ref)
                notes.append(f"{ref} points at {prev[:19]} again")
        except Exception:  # noqa: BLE001 - best effort; the original error matters
            notes.append(f"could not restore {ref}")
    return notes


# ----------------------------------------------------------------------------- push
def push(eng: engine.ContainerEngine, ref: str, say: Say = print) -> None:
    """The engine's push, retried under the network policy while the failure is transient."""
    say(f"push    {ref}")
    attempts = netpolicy.attempts()

    def once() -> None:
        eng.push(ref)

    def before_sleep(state) -> None:
        err = state.outcome.exception()
        say(
            f"retry   {ref}: attempt {state.attempt_number}/{attempts} failed "
            f"({last_words(err.stderr, 160)}); pushing again in {state.next_action.sleep:.1f} s"
        )

    netpolicy.retrying(lambda e: isinstance(e, PushFailed) and e.transient, before_sleep)(once)


def publish(
    eng: engine.ContainerEngine,
    local: str,
    repository: str,
    identity: str,
    profile: str,
    reg: Registry,
    client: RegistryClient | None = None,
    say: Say = print,
    before_move: Callable[[str], None] | None = None,
    replace: bool = False,
) -> str:
    """Push the tested local image `local` as REG/repository:identity, then move
    REG/repository:profile to it; returns the registry digest. `before_move(digest)` runs
    between the two (the SBOM is attached there: `<profile>` never names an image without
    it). `identity` and `profile` are the tags of the layer format the engine pushes
    (assembly/formattags.py). With `replace`, the content tag names the same image in another
    layer format (pipeline._remote): it is pushed over, and never deleted on roll-back. On
    any failure, what this call tagged is rolled back (local registry-prefixed tags, and a
    content tag it created in the registry) and the error is raised."""
    client = client or RegistryClient(reg)
    content = reg.ref(repository, identity)
    human = reg.ref(repository, profile)
    had_content = client.manifest_digest(repository, identity)
    created = had_content is None and not replace
    prev_local = local_tags(eng, (content, human))
    try:
        eng.tag(local, content)
        if had_content is None or replace:
            push(eng, content, say)
        digest = client.manifest_digest(repository, identity)
        if digest is None:
            raise EnvironmentProblem(f"pushed {content} but the registry does not list it")
        if before_move is not None:
            before_move(digest)
        if client.manifest_digest(repository, profile) != digest:
            eng.tag(local, human)
            push(eng, human, say)
            if client.manifest_digest(repository, profile) != digest:
                raise EnvironmentProblem(f"{human} does not point at {digest} after the push")
        return digest
    except BaseException:
        restore_local_tags(eng, prev_local)
        if created:
            try:  # by the digest of its bytes, whatever a lying header said
                got = client.manifest(repository, identity, check_header=False)
                if got:
                    client.delete_manifest(repository, got[1])
            except Exception:  # noqa: BLE001 - best effort; the original error matters
                pass
        raise
