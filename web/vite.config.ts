import preact from "@preact/preset-vite";
import { defineConfig } from "vite";

// The build lands inside the server package, which serves it at / and ships it in the wheel.
export default defineConfig({
  plugins: [preact({ devToolsEnabled: false, prefreshEnabled: false })],
  base: "/",
  build: {
    outDir: "../server/smon_server/dashboard/dist",
    emptyOutDir: true,
    chunkSizeWarningLimit: 400,
  },
  server: {
    // `npm run dev` against a local `smon server`.
    proxy: { "/api": "http://127.0.0.1:8080" },
  },
});
