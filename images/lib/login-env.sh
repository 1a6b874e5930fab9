#!/bin/sh
# Writes the profile.d script named by $1 (rendered Dockerfile, python layer; bind-mounted,
# never in a layer). Login shells (`bash -l`, `sh -l`: what cluster job scripts run) read
# /etc/profile, which sets PATH from scratch on Debian and Ubuntu and so drops the venv and
# CUDA that the image's ENV put there; the scripts in /etc/profile.d run after that. The one
# written here puts this step's PATH (the image's ENV PATH) back in front and keeps, after it,
# any entry the login shell added (/usr/games for users other than root). It only touches
# PATH: /etc/profile resets nothing else, and every other ENV variable reaches the login
# shell unchanged (the in-image check `login-shell` compares all of them).
set -eu
case "$PATH" in
*"'"*)
    echo "login-env: PATH contains a single quote; cannot write it into $1" >&2
    exit 1
    ;;
esac
mkdir -p "$(dirname "$1")"
cat >"$1" <<SCRIPT
# Written at build time by the MTP image builder (images/lib/login-env.sh): the image's
# PATH, restored in login shells after /etc/profile reset it.
_mtp_image_path='$PATH'
_mtp_keep=
_mtp_rest="\$PATH:"
while [ -n "\$_mtp_rest" ]; do
    _mtp_dir=\${_mtp_rest%%:*}
    _mtp_rest=\${_mtp_rest#*:}
    case ":\$_mtp_image_path:" in
    *":\$_mtp_dir:"*) ;;
    *) _mtp_keep="\$_mtp_keep:\$_mtp_dir" ;;
    esac
done
PATH="\$_mtp_image_path\$_mtp_keep"
export PATH
unset _mtp_image_path _mtp_keep _mtp_rest _mtp_dir
SCRIPT
