// Stylesheets are bundled by Vite; TypeScript only needs to know they may be imported.
declare module "*.css";
