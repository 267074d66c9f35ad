# The examples' image, ghcr.io/eddyline/examples:<version>, which the examples' cluster
# manifests (examples/*/streamapp.cluster.yaml) run: the eddyline image plus each example's
# topology module on the Python path (`spec.topology.ref: wordcount:topology` imports
# `wordcount`). Build the eddyline image first (`make image`), then `make examples-image`:
#   docker build -f examples.Dockerfile --build-arg BASE=eddyline:dev \
#     -t ghcr.io/eddyline/examples:0.1.0 .
ARG BASE=eddyline:dev
FROM ${BASE}
# Only the modules: the manifests and READMEs are for kubectl and people, not for pods.
COPY examples/wordcount/wordcount.py /opt/eddyline/examples/wordcount/
COPY examples/click_enrichment/click_enrichment.py /opt/eddyline/examples/click_enrichment/
COPY examples/custom_processor/custom_processor.py /opt/eddyline/examples/custom_processor/
COPY examples/page_views/page_views.py /opt/eddyline/examples/page_views/
COPY examples/user_sessions/user_sessions.py /opt/eddyline/examples/user_sessions/
COPY examples/ad_clicks/ad_clicks.py /opt/eddyline/examples/ad_clicks/
COPY examples/customer_accounts/customer_accounts.py /opt/eddyline/examples/customer_accounts/
ENV PYTHONPATH=/opt/eddyline/examples/wordcount:/opt/eddyline/examples/click_enrichment:/opt/eddyline/examples/custom_processor:/opt/eddyline/examples/page_views:/opt/eddyline/examples/user_sessions:/opt/eddyline/examples/ad_clicks:/opt/eddyline/examples/customer_accounts
# The base image's non-root user (its pods run with runAsNonRoot and uid 10001).
USER 10001
