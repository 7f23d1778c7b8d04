{{/*
The spec of a KubeRay RayCluster: the long-lived one (mode: cluster) and each RayJob's (mode: rayjob).
Called with (dict "root" $ "job" <rayJob.jobs entry or nil>); a job's spec is mounted on the head,
where the RayJob's entrypoint runs.
*/}}
{{- define "tgc-rl.rayClusterSpec" -}}
{{- $root := .root -}}
{{- $job := .job -}}
{{- $fullname := include "tgc-rl.fullname" $root -}}
rayVersion: {{ $root.Values.rayCluster.rayVersion | quote }}
enableInTreeAutoscaling: {{ $root.Values.rayCluster.enableInTreeAutoscaling }}
{{- if $root.Values.rayCluster.enableInTreeAutoscaling }}
autoscalerOptions:
  idleTimeoutSeconds: {{ $root.Values.rayCluster.autoscaler.idleTimeoutSeconds }}
  upscalingMode: {{ $root.Values.rayCluster.autoscaler.upscalingMode }}
  env:
    {{- include "tgc-rl.rayAuthEnv" $root | nindent 4 }}
{{- end }}
headGroupSpec:
  serviceType: ClusterIP
  rayStartParams:
    {{- range $k, $v := $root.Values.rayCluster.head.rayStartParams }}
    {{ $k }}: {{ $v | quote }}
    {{- end }}
    metrics-export-port: {{ $root.Values.metrics.rayMetricsPort | quote }}
  template:
    metadata:
      labels:
        {{- include "tgc-rl.labels" $root | nindent 8 }}
        app.kubernetes.io/component: ray-head
    spec:
      serviceAccountName: {{ include "tgc-rl.rayServiceAccountName" $root }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsUser: 1000
        runAsGroup: 1000
        fsGroup: 1000
      containers:
        - name: ray-head
          image: {{ include "tgc-rl.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          env:
            {{- include "tgc-rl.rayAuthEnv" $root | nindent 12 }}
          securityContext:
            allowPrivilegeEscalation: false
            runAsNonRoot: true
            capabilities: {drop: [ALL]}
          ports:
            - {name: gcs, containerPort: 6379}
            - {name: dashboard, containerPort: {{ $root.Values.rayCluster.dashboardPort }}}
            - {name: client, containerPort: 10001}
            - {name: metrics, containerPort: {{ $root.Values.metrics.rayMetricsPort }}}
          resources:
            {{- toYaml $root.Values.rayCluster.head.resources | nindent 12 }}
          volumeMounts:
            {{- include "tgc-rl.rayVolumeMounts" $root | nindent 12 }}
            {{- if $job }}
            - name: job-spec
              mountPath: /etc/tgc-rl/job
              readOnly: true
            {{- end }}
      volumes:
        {{- include "tgc-rl.rayVolumes" $root | nindent 8 }}
        {{- if $job }}
        - name: job-spec
          configMap:
            name: {{ $fullname }}-job-{{ $job.name }}
        {{- end }}
      {{- with $root.Values.rayCluster.head.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.rayCluster.head.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
workerGroupSpecs:
  {{- range $root.Values.rayCluster.workerGroups }}
  {{- if or (not (hasKey . "enabled")) .enabled }}
  {{- if or (lt (int .replicas) (int .minReplicas)) (gt (int .replicas) (int .maxReplicas)) }}
  {{- fail (printf "rayCluster.workerGroups %s: replicas %v must lie within minReplicas %v and maxReplicas %v" .name .replicas .minReplicas .maxReplicas) }}
  {{- end }}
  - groupName: {{ .name }}
    replicas: {{ .replicas }}
    minReplicas: {{ .minReplicas }}
    maxReplicas: {{ .maxReplicas }}
    rayStartParams:
      {{- range $k, $v := .rayStartParams }}
      {{ $k }}: {{ $v | quote }}
      {{- end }}
      metrics-export-port: {{ $root.Values.metrics.rayMetricsPort | quote }}
    template:
      metadata:
        labels:
          {{- include "tgc-rl.labels" $root | nindent 10 }}
          app.kubernetes.io/component: ray-worker
          tgc-rl/worker-group: {{ .name }}
      spec:
        serviceAccountName: {{ include "tgc-rl.rayServiceAccountName" $root }}
        {{- with $root.Values.imagePullSecrets }}
        imagePullSecrets:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- if $root.Values.sandbox.enabled }}
        hostUsers: {{ $root.Values.sandbox.hostUsers }}
        {{- end }}
        securityContext:
          fsGroup: 1000
        containers:
          - name: ray-worker
            image: {{ .image | default (include "tgc-rl.image" $root) }}
            imagePullPolicy: {{ $root.Values.image.pullPolicy }}
            env:
              {{- include "tgc-rl.rayAuthEnv" $root | nindent 14 }}
            securityContext:
              {{- if $root.Values.sandbox.enabled }}
              {{- toYaml $root.Values.sandbox.securityContext | nindent 14 }}
              {{- else }}
              runAsUser: 1000
              runAsNonRoot: true
              allowPrivilegeEscalation: false
              capabilities: {drop: [ALL]}
              {{- end }}
            ports:
              - {name: metrics, containerPort: {{ $root.Values.metrics.rayMetricsPort }}}
            resources:
              {{- toYaml .resources | nindent 14 }}
            volumeMounts:
              {{- include "tgc-rl.rayVolumeMounts" $root | nindent 14 }}
        volumes:
          {{- include "tgc-rl.rayVolumes" $root | nindent 10 }}
        {{- with .nodeSelector }}
        nodeSelector:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with .tolerations }}
        tolerations:
          {{- toYaml . | nindent 10 }}
        {{- end }}
  {{- end }}
  {{- end }}
{{- end -}}
