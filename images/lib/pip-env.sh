# Sourced by every install RUN of the rendered Dockerfile (bind-mounted, never in a layer).
# BuildKit mounts a secret only when the build was given it (`--ca-bundle`, `--netrc`);
# the files live in a tmpfs for one RUN and are not part of any layer.
if [ -s /run/secrets/ca-bundle ]; then
    echo "pip-env: HTTPS inside this step trusts the CA bundle given with --ca-bundle"
    export PIP_CERT=/run/secrets/ca-bundle
    export SSL_CERT_FILE=/run/secrets/ca-bundle
    export REQUESTS_CA_BUNDLE=/run/secrets/ca-bundle
    export GIT_SSL_CAINFO=/run/secrets/ca-bundle
fi
# The site's index mirrors (MTP_INDEX_REWRITE): the tool passes the table of this plan's index
# URLs and their mirrors as the secret `index-mirrors` (empty without mirrors), and `pip` in
# this step then fetches through them (mtp_pip.py rewrites --index-url/--extra-index-url);
# the rendered command lines keep the manifests' URLs. The table may hold a token: not shown.
if [ -s /run/secrets/index-mirrors ]; then
    echo "pip-env: pip in this step fetches through the site's index mirrors (MTP_INDEX_REWRITE)"
    pip() { python /tmp/mtp-build/lib/mtp_pip.py "$@"; }
fi
