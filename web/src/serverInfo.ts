// What the server says about itself (`GET /info`), for components deep in a page: its thresholds,
// so every number is judged as the server's analyses judge it, not by a copy of them.
import { createContext } from "preact";
import { useContext } from "preact/hooks";

import type { Info } from "./api";

/** Null until the server has answered. */
export const ServerInfo = createContext<Info | null>(null);

export function useServerInfo(): Info | null {
  return useContext(ServerInfo);
}
