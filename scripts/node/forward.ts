/**
 * The one TCP/Unix-socket forward of the test node, used on both sides of the namespace
 * boundary: the host listens on 127.0.0.1 and connects to the holder's Unix socket; the holder
 * listens on that socket and connects to the node's address inside.
 */
import { createConnection, createServer, type NetConnectOpts, type Server } from 'node:net';

/**
 * A server that joins each connection to a new one made to `target`; an error or end on either
 * side ends both. Not listening yet: the caller chooses where.
 */
export function forwardingServer(target: NetConnectOpts): Server {
  return createServer((inbound) => {
    const outbound = createConnection(target);
    inbound.pipe(outbound).pipe(inbound);
    const close = () => {
      inbound.destroy();
      outbound.destroy();
    };
    inbound.on('error', close);
    outbound.on('error', close);
  });
}
