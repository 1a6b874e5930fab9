"""`build.py demo`: the whole tool, end to end, on this machine, in minutes.

Everything the real stack needs from outside (GitHub, a CUDA base, a registry) is made on
loopback from the same code the end-to-end tests use:

    gitrepos.py   small, deterministic git repositories standing in for the upstreams
    gitserver.py  a git daemon serving them, and the git config that sends github.com there
    registry.py   a registry of its own on a free loopback port (distribution's binary)
    testbase.py   the local Debian base image, pushed there so it has a registry digest
    manifests.py  the demo's manifests directory: one small profile pinning the stand-ins
    hostcheck.py  what the demo needs on this machine, checked first, in one line
    run.py        the steps a user runs (lock, check, build, push, pull, test, verify), timed,
                  and the teardown of everything the demo made
"""
