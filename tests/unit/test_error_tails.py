"""A tool's message is cut from its end (where it says why) at a word, and the cut is marked.

Seen on the real stack (2026-12-06): a push retry said "(egistry 127.0.0.1:5000 answered HTTP
500 ...)": the message was cut 160 characters from its end, inside a word, with no mark.
"""

from __future__ import annotations

from mtpimage.assembly import release
from mtpimage.engine.containerengine import PushFailed
from mtpimage.errors import last_words

REASON = (
    "registry 127.0.0.1:5000 answered HTTP 500 (uploading blob sha256:"
    + "d8" * 32
    + " to 127.0.0.1:5000/r48/mtp-verl)"
)


def test_a_short_message_is_kept_whole_with_its_spaces_collapsed():
    assert last_words("  no   space\nleft ", 40) == "no space left"


def test_a_long_message_keeps_its_end_cut_at_a_word_and_marked():
    why = "registry 127.0.0.1:5000 answered HTTP 500"
    text = "error: " + "x" * 500 + " " + why
    got = last_words(text, 160)
    assert got == "... " + why
    got = last_words("error: " + REASON, 160)
    assert got.startswith("... ") and got.endswith(" to 127.0.0.1:5000/r48/mtp-verl)")
    assert len(got) <= 160 + len("... ")
    # every word kept is whole: each is a word of the message
    assert set(got[4:].split()) <= set(REASON.split())


def test_a_push_retry_line_keeps_whole_words():
    said: list[str] = []
    attempts = iter([PushFailed("127.0.0.1:5000/r48/mtp-verl:t", "pushing: " * 40 + REASON, True)])

    class Engine:
        def push(self, ref):
            err = next(attempts, None)
            if err:
                raise err

    release.push(Engine(), "127.0.0.1:5000/r48/mtp-verl:t", said.append)
    retry = [line for line in said if line.startswith("retry")]
    assert retry, said
    why = retry[0].split("failed (", 1)[1]
    why = why.rsplit("); pushing again", 1)[0]
    assert why.startswith("... ") and "answered HTTP 500" in why, retry[0]
    assert set(why[4:].split()) <= set(("pushing: " * 40 + REASON).split()), retry[0]


def test_a_tools_full_disk_is_this_machines_disk_exit_5_with_where_to_free():
    from mtpimage.errors import EXIT_DISK, DiskProblem, full_disk

    # buildah 1.28's words when the layout filled /var/tmp (the real stack, 2026-12-06)
    said = 'pushing image "sha256:de66" to "oci:/var/tmp/x/oci": writing blob: write /var/tmp/x/oci/b: no space left on device'
    full = full_disk(said)
    assert full is not None and full.errno == 28
    err = DiskProblem("writing the image's layout", "/var/tmp/x/oci", full, room="/var/tmp and MTP_CACHE_DIR")
    assert err.exit_code == EXIT_DISK
    line = err.one_line()
    assert "writing to /var/tmp/x/oci gave No space left on device" in line
    assert "(fix: free space in /var/tmp and MTP_CACHE_DIR" in line
    assert full_disk("dial tcp 127.0.0.1:5000: connection refused") is None
