# One image for every function (SPEC §13): `node /app/dist/main.mjs <function>`, where the
# Knative Service passes the function name as its argument (manifests/base/services.yaml).
# The runner for Terraform Jobs is in the same image: `node /app/dist/captf-runner.mjs -- …`.
#
#   docker build -t <registry>/captf-credentials:<tag> .
#
# Both stages use the same Node image, so the V8 compile cache written at build time
# matches the runtime's Node exactly (a different Node version ignores it harmlessly).
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
COPY scripts/lib/warm-compile-cache.ts /tmp/warm-compile-cache.ts
# Start each function once so V8's compile cache holds their code (about 80 ms less to the
# first /healthz, README "Deploy on Knative"); then make everything read-only.
RUN node /tmp/warm-compile-cache.ts /app/compile-cache /app/dist \
 && rm /tmp/warm-compile-cache.ts \
 && chmod -R a-w /app
ENV NODE_ENV=production \
    NODE_COMPILE_CACHE=/app/compile-cache \
    PORT=8080
# Any non-root UID works (nothing is written at runtime); 65532 matches the manifests.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["node", "/app/dist/main.mjs"]
