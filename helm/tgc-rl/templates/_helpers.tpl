{{/* Names and labels shared by the templates. */}}
{{- define "tgc-rl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tgc-rl.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tgc-rl.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: control-plane
{{- end -}}

{{- define "tgc-rl.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tgc-rl.raySelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tgc-rl.rayServiceAccountName" -}}
{{- printf "%s-ray" (include "tgc-rl.fullname" .) -}}
{{- end -}}

{{- define "tgc-rl.metricsSecret" -}}
{{- default (printf "%s-metrics" (include "tgc-rl.fullname" .)) .Values.metrics.token.existingSecret -}}
{{- end -}}

{{- define "tgc-rl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tgc-rl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tgc-rl.rayAuthSecret" -}}
{{- default (printf "%s-ray-auth" (include "tgc-rl.fullname" .)) .Values.rayCluster.auth.existingSecret -}}
{{- end -}}

{{- define "tgc-rl.runsClaim" -}}
{{- default (printf "%s-runs" (include "tgc-rl.fullname" .)) .Values.sharedStorage.existingClaim -}}
{{- end -}}

{{/* Ray token authentication for every Ray container. */}}
{{- define "tgc-rl.rayAuthEnv" -}}
{{- if .Values.rayCluster.auth.enabled }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "tgc-rl.rayAuthSecret" . }}
      key: {{ .Values.rayCluster.auth.secretKey }}
{{- else }}
- name: RAY_AUTH_MODE
  value: disabled
{{- end }}
{{- end -}}

{{/* The shared run directories and a memory-backed /dev/shm (object store, vLLM) in Ray pods. */}}
{{- define "tgc-rl.rayVolumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
{{- if .Values.sharedStorage.enabled }}
- name: runs
  mountPath: {{ .Values.sharedStorage.mountPath }}
{{- end }}
{{- end -}}

{{- define "tgc-rl.rayVolumes" -}}
- name: dshm
  emptyDir: {medium: Memory}
{{- if .Values.sharedStorage.enabled }}
- name: runs
  persistentVolumeClaim:
    claimName: {{ include "tgc-rl.runsClaim" . }}
{{- end }}
{{- end -}}
