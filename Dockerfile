# One image for every function (SPEC §13): `node /app/dist/main.mjs <function>`, where the
# Knative Service passes the function name as its argument (manifests/base/services.yaml).
# The runner for Terraform Jobs is in the same image: `node /app/dist/captf-runner.mjs -- …`.
#
#   docker build -t <registry>/captf-credentials:<tag> .
#
# `npm run image` builds the same /app, config and Node without Docker, reproducibly; a test holds
# the two to each other (docs/deploy-knative.md). Neither ships a V8 compile cache: it is not
# byte-stable, and one written here as root would never be read by UID 65532.
ARG NODE_IMAGE=node:24.21.0-bookworm-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY functions ./functions
COPY scripts ./scripts
RUN npm run build

FROM ${NODE_IMAGE}
WORKDIR /app
# Bundles are self-contained: no node_modules in the image.
COPY --from=build /src/dist ./dist
RUN chmod -R a-w /app
ENV NODE_ENV=production \
    PORT=8080
# Any non-root UID works (nothing is written at runtime); 65532 matches the manifests.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["node", "/app/dist/main.mjs"]
